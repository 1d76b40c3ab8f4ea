"""Who is calling and what they may do: identities and roles, bearer tokens, and the
limits on what an identity may submit."""
