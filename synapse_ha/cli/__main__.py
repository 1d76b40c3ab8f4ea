from synapse_ha.cli.main import main

main()
