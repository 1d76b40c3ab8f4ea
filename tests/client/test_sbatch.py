"""Slurm batch scripts translated to job specs (synapse_ha.client.sbatch): every supported
option, command-line options over #SBATCH lines, and each refusal naming its line."""

from __future__ import annotations

import datetime
from collections.abc import Mapping

import pytest

from synapse_ha.client.sbatch import (
    STEPD,
    NodeShape,
    SbatchError,
    script_position,
    split_options,
    translate,
    whole_node_shape,
)
from synapse_ha.client.slurm_times import begin_text, time_seconds
from synapse_ha.core.spec.document import SpecError, parse_job_spec

SCRIPT = """#!/bin/bash
#SBATCH --job-name=LLaMA_pretrain.v2
#SBATCH -N 4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:h100:8
#SBATCH --cpus-per-task=32 --mem=512G
#SBATCH -t 2-00:00:00
#SBATCH -p research
#SBATCH --qos=high
#SBATCH -d afterok:12:job-000013,afterany:14
#SBATCH -D /data/run1
#SBATCH --export=NONE,HF_HOME=/data/hf,WANDB_PROJECT
#SBATCH --requeue
#SBATCH -o logs/%j.out
#SBATCH -e logs/%j.err

srun-free torchrun train.py "$@"
#SBATCH --not-a-directive-any-more
"""


def test_every_supported_option_is_translated() -> None:
    out = translate(
        SCRIPT, "jobs/pretrain.sh", args=["--lr", "3e-4"], environ={"WANDB_PROJECT": "p"}
    )
    spec = out.spec
    assert spec["name"] == "llama-pretrain-v2"
    assert spec["replicas"] == 4
    assert spec["resources"] == {"gpu": 8, "cpu": 32, "memory": "512Gi"}
    assert spec["time_limit"] == "172800s"
    assert (spec["queue"], spec["priority"], spec["workdir"]) == ("research", "high", "/data/run1")
    assert spec["dependencies"] == {
        "afterok": ["job-000012", "job-000013"],
        "afterany": ["job-000014"],
    }
    assert spec["env"]["HF_HOME"] == "/data/hf" and spec["env"]["WANDB_PROJECT"] == "p"
    # Every member runs the step daemon; the first node's runs the script once.
    command = spec["command"]
    at = command.index("--")
    assert command[:4] == ["/bin/sh", "-c", STEPD, "stepd"]
    assert command[4:at] == [
        "--ntasks", "4", "--tasks-per-node", "1", "--output", "logs/%j.out",
        "--error", "logs/%j.err",
    ]  # fmt: skip
    interpreter, flag, body, name, *args = command[at + 1 :]
    assert (interpreter, flag, name, args) == ("/bin/bash", "-c", "pretrain.sh", ["--lr", "3e-4"])
    assert body == SCRIPT
    assert len(spec["env"]["SYNAPSE_STEP_SECRET"]) == 64
    assert [n.split(": ")[1] for n in out.notes] == ["--requeue"]
    assert spec["workdir"] == "/data/run1"
    parsed = parse_job_spec(spec, topology_levels=None)  # a valid job spec
    assert parsed.spec.replicas == 4 and parsed.spec.resources.gpu == 8


def test_command_line_options_win_over_the_script() -> None:
    options = ["-N", "2", "--time=90", "--gpus-per-node=a100:4"]
    out = translate(SCRIPT, "pretrain.sh", options, environ={"WANDB_PROJECT": "p"})
    assert out.spec["replicas"] == 2 and out.spec["time_limit"] == "5400s"
    assert out.spec["resources"]["gpu"] == 4


def test_a_script_without_options_runs_under_sh_as_one_member() -> None:
    spec = translate("echo hi\n", "hello.sh").spec
    assert spec["command"][9:11] == ["/bin/sh", "-c"] and spec["replicas"] == 1
    assert spec["resources"] == {"gpu": 0, "cpu": 0, "memory": 0}
    parse_job_spec(spec, topology_levels=None)


@pytest.mark.parametrize(
    ("line", "where", "says"),
    [
        ("#SBATCH --array=0-9%0", "s.sh:2", "the throttle after % must be"),
        ("#SBATCH --array=9-0", "s.sh:2", "a range ends at or after its start"),
        ("#SBATCH -N 2 -n 1", "s.sh:2", "-n: fewer tasks than nodes (2)"),
        ("#SBATCH -N 2 -n 9 --ntasks-per-node=4", "s.sh:2", "more than --ntasks-per-node 4"),
        ("#SBATCH --ntasks-per-node=0", "s.sh:2", "give a whole number of 1 or more"),
        ("#SBATCH -N 2 --gpus=3", "s.sh:2", "a multiple of the node count (2)"),
        ("#SBATCH --ti=5", "s.sh:2", "ambiguous: it may be any of --time, --time-min"),
        ("#SBATCH --frobnicate=1", "s.sh:2", "--frobnicate: not an sbatch option"),
        ("#SBATCH -Z", "s.sh:2", "-Z: not an sbatch option"),
        ("#SBATCH --requeue=yes", "s.sh:2", "takes no value"),
        ("#SBATCH --switches=1", "s.sh:2", "--switches=1: not supported"),
        ("#SBATCH -N 2-4", "s.sh:2", "a range min-max is not supported"),
        ("#SBATCH --gres=nvme:1", "s.sh:2", "only gpu:N or gpu:TYPE:N"),
        ("#SBATCH --mem=0", "s.sh:2", "--mem=0: needs the cluster's node shape"),
        ("#SBATCH --exclusive", "s.sh:2", "--exclusive: needs the cluster's node shape"),
        ("#SBATCH -t soon", "s.sh:2", "give a time limit"),
        ("#SBATCH -d aftercorr:12", "s.sh:2", "supported are afterok"),
        ("#SBATCH -d afterok:1?afterany:2", "s.sh:2", "'?' (any of) is not supported"),
        ("#SBATCH --export=NOT_SET_HERE", "s.sh:2", "NOT_SET_HERE is not set here"),
        ("#SBATCH --begin=teatime", "s.sh:2", "teatime and MMDDYY are not supported"),
        ("#SBATCH --begin=now+1fortnight", "s.sh:2", "give seconds, minutes, hours"),
        ("#SBATCH -J", "s.sh:2", "-J: needs a value"),
    ],
)
def test_options_that_cannot_be_translated_are_refused_with_their_line(
    line: str, where: str, says: str
) -> None:
    with pytest.raises(SbatchError) as refused:
        translate(f"#!/bin/sh\n{line}\necho\n", "s.sh", environ={})
    assert refused.value.where == where
    assert says in str(refused.value)


def test_slurm_time_formats() -> None:
    assert [time_seconds(t) for t in ("90", "10:30", "1:00:00", "2-3", "2-3:04", "2-3:04:05")] == [
        5400, 630, 3600, 2 * 86400 + 3 * 3600, 2 * 86400 + 3 * 3600 + 240,
        2 * 86400 + 3 * 3600 + 245,
    ]  # fmt: skip
    for bad in ("0", "UNLIMITED", "1:2:3:4", ""):
        with pytest.raises(ValueError, match="give a time limit"):
            time_seconds(bad)


def test_the_script_is_the_first_word_that_is_not_an_option() -> None:
    assert script_position(["-N", "2", "--gres=gpu:8", "--requeue", "run.sh", "-x"]) == 4
    assert script_position(["-N2", "run.sh"]) == 1
    assert script_position(["-N", "2"]) == 2


def test_an_array_and_a_begin_time_are_translated() -> None:
    out = translate(
        "#!/bin/sh\n#SBATCH --array=0-15:4%2\n#SBATCH --begin=now+1hour\necho\n", "s.sh"
    )
    assert out.spec["array"] == "0-15:4%2" and out.spec["begin"] == "+3600s"
    parsed = parse_job_spec(out.spec, topology_levels=None)
    assert parsed.spec.array == "0-15:4%2" and parsed.spec.begin_delay_ms == 3_600_000
    on_line = translate("echo\n", "s.sh", ["-a", "1,3"]).spec
    assert on_line["array"] == "1,3"


def test_begin_times_are_read_in_the_submitting_machines_zone() -> None:
    zone = datetime.timezone(datetime.timedelta(hours=2))
    now = datetime.datetime(2026, 11, 27, 15, 0, tzinfo=zone)
    assert begin_text("2026-12-01T02:00", now) == "2026-12-01T00:00:00Z"
    assert begin_text("2026-12-01", now) == "2026-11-30T22:00:00Z"
    assert begin_text("16:30", now) == "2026-11-27T14:30:00Z"  # later today
    assert begin_text("14:00", now) == "2026-11-28T12:00:00Z"  # past: tomorrow
    assert begin_text("now+90", now) == "+90s"
    assert begin_text("now+2days", now) == "+172800s"


def test_options_as_real_scripts_write_them() -> None:
    """Prefixes, aliases, several options and a comment on one line, grouped flags, an
    optional value, and the counts read against the node count."""
    script = """#!/bin/bash
#SBATCH --nodes 2 --tasks-per-node=1   # one launcher per node
#SBATCH --ntasks=2
#SBATCH --gpus-per-task=8
#SBATCH --err=logs/%x-%j.err --out logs/%x-%j.out
#SBATCH --open-mode=append --mail-type=END,FAIL --mail-user=me@example.org
#SBATCH --hint=nomultithread --comment "llama sweep"
#SBATCH --job=sweep --time=30
#SBATCH --wait-all-nodes=1
srun torchrun train.py
"""
    out = translate(script, "sweep.sh")
    spec = out.spec
    assert spec["replicas"] == 2 and spec["resources"]["gpu"] == 8
    assert spec["name"] == "sweep" and spec["time_limit"] == "1800s"
    noted = {line.split(": ")[1] for line in out.notes}
    assert noted == {
        "--mail-type=END,FAIL", "--mail-user=me@example.org", "--hint=nomultithread",
        "--wait-all-nodes=1",
    }  # fmt: skip
    assert spec["env"]["SYNAPSE_SBATCH_COMMENT"] == "llama sweep"  # kept, not noted
    files = spec["command"][spec["command"].index("--output") : spec["command"].index("--")]
    assert files == [
        "--output", "logs/%x-%j.out", "--error", "logs/%x-%j.err", "--open-mode", "append",
    ]  # fmt: skip
    parse_job_spec(spec, topology_levels=None)
    total = translate("#!/bin/sh\n#SBATCH -N 4 --gpus=h100:32\necho\n", "s.sh").spec
    assert total["resources"]["gpu"] == 8
    flags = split_options(["-HQ", "-k", "--exclusive=user", "-N2"], "command line")
    assert flags == [
        ("hold", None, "-HQ"), ("quiet", None, "-Q"), ("no-kill", None, "-k"),
        ("exclusive", "user", "--exclusive=user"), ("nodes", "2", "-N2"),
    ]  # fmt: skip
    assert script_position(["--exclusive", "--err", "e.log", "run.sh"]) == 3


def test_a_relative_working_directory_is_the_submission_directorys() -> None:
    script = "#!/bin/sh\n#SBATCH -D .\necho\n"
    assert translate(script, "s.sh", submit_dir="/home/ann/run").spec["workdir"] == "/home/ann/run"
    deeper = translate(script, "s.sh", ["--chdir=../out"], submit_dir="/home/ann/run").spec
    assert deeper["workdir"] == "/home/ann/out"
    assert translate("#SBATCH -D /data\n", "s.sh", submit_dir="/x").spec["workdir"] == "/data"


@pytest.mark.parametrize(
    ("options", "replicas", "gpu", "cpu", "counts"),
    [
        ("--ntasks=4 --gpus-per-task=1", 1, 4, 0, ["4", "4"]),
        ("-N 2 --ntasks-per-node=8 -c 4 --gres=gpu:8", 2, 8, 32, ["16", "8"]),
        ("-N 2 -n 3", 2, 0, 0, ["3", "2"]),
        ("-N 2 --tasks-per-node=1 --gpus-per-task=8", 2, 8, 0, ["2", "1"]),
    ],
)
def test_tasks_size_each_nodes_member_and_reach_the_step_daemon(
    options: str, replicas: int, gpu: int, cpu: int, counts: list[str]
) -> None:
    spec = translate(f"#!/bin/sh\n#SBATCH {options}\necho\n", "s.sh").spec
    assert spec["replicas"] == replicas
    assert (spec["resources"]["gpu"], spec["resources"]["cpu"]) == (gpu, cpu)
    assert spec["command"][4:8] == ["--ntasks", counts[0], "--tasks-per-node", counts[1]]
    parse_job_spec(spec, topology_levels=None)


def test_a_signal_before_the_time_limit_reaches_the_step_daemon() -> None:
    spec = translate("#!/bin/sh\n#SBATCH -t 10 --signal=B:USR1@90 --wckey=x\necho\n", "s.sh").spec
    command = spec["command"]
    assert command[command.index("--signal") + 1] == "B:10@90"
    assert "--time-limit=600" in command
    plain = translate("#!/bin/sh\n#SBATCH --signal=SIGUSR2\necho\n", "s.sh").spec["command"]
    assert plain[plain.index("--signal") + 1] == "12@60"
    with pytest.raises(SbatchError, match="give \\[B:\\]SIGNAL"):
        translate("#SBATCH --signal=NOPE@9\n", "s.sh")


def test_an_account_is_a_label_on_the_job_and_keeps_its_rule() -> None:
    spec = translate("#!/bin/sh\n#SBATCH -A proj-42.a\necho\n", "s.sh").spec
    assert spec["account"] == "proj-42.a"
    assert parse_job_spec(spec, topology_levels=None).spec.account == "proj-42.a"
    bad = translate("#!/bin/sh\n#SBATCH --account='a b'\necho\n", "s.sh").spec
    with pytest.raises(SpecError) as refused:
        parse_job_spec(bad, topology_levels=None)
    assert [v.field for v in refused.value.violations] == ["account"]


def test_memory_per_gpu_or_cpu_sizes_each_nodes_member() -> None:
    per_gpu = translate("#SBATCH -N 2 --gres=gpu:4 --mem-per-gpu=16G\n", "s.sh").spec
    assert per_gpu["resources"]["memory"] == "64Gi"
    per_cpu = translate("#SBATCH --ntasks-per-node=2 -c 4 --mem-per-cpu=2000\n", "s.sh").spec
    assert per_cpu["resources"]["memory"] == "16000Mi"
    with pytest.raises(SbatchError, match="with GPUs asked for each node"):
        translate("#SBATCH --mem-per-gpu=16G\n", "s.sh")
    noted = translate("#SBATCH -t 60 --time-min=30\n", "s.sh")
    assert noted.spec["time_limit"] == "3600s" and "--time-min=30" in noted.notes[0]


def test_exclusive_takes_the_clusters_node_shape_whole() -> None:
    shape = NodeShape(gpu=8, cpu_milli=64_000, memory_mib=1_048_576)
    spec = translate(
        "#SBATCH -N 2 --exclusive --gres=gpu:4\n", "s.sh", node_shape=lambda _selected: shape
    ).spec
    assert spec["resources"] == {"gpu": 8, "cpu": "64000m", "memory": "1048576Mi"}
    assert "nodes" not in spec
    parse_job_spec(spec, topology_levels=None)
    memory = translate("#SBATCH --gres=gpu:2 --mem=0\n", "s.sh", node_shape=lambda _s: shape)
    assert memory.spec["resources"] == {"gpu": 2, "cpu": 0, "memory": "1048576Mi"}

    def none(_selected: object) -> NodeShape:
        raise ValueError("the cluster has no live node yet to take whole")

    with pytest.raises(SbatchError, match="--exclusive: the cluster has no live node yet"):
        translate("#SBATCH --exclusive\n", "s.sh", node_shape=none)


def test_on_mixed_nodes_whole_nodes_are_of_the_most_common_shape_the_others_excluded() -> None:
    big, small = NodeShape(8, 96_000, 1_000_000), NodeShape(4, 32_000, 256_000)
    nodes = [("a1", small), ("b1", big), ("b2", big), ("a2", small), ("b3", big)]
    chosen = whole_node_shape(nodes)
    assert (chosen.gpu, chosen.others) == (8, ("a1", "a2"))
    assert whole_node_shape(nodes[:2]).gpu == 8  # a tie: the larger
    asked: list[object] = []

    def shape_of(selected: Mapping[str, object]) -> NodeShape:
        asked.append(dict(selected))
        return chosen

    out = translate("#SBATCH -N 2 --exclusive -x a2,c9 -C ib\n", "s.sh", node_shape=shape_of)
    assert asked == [{"exclude": ["a2", "c9"], "features": "ib"}]  # it asks with the selector
    assert out.spec["nodes"]["exclude"] == ["a1", "a2", "c9"]
    assert out.spec["resources"]["gpu"] == 8
    assert "whole nodes of the most common one (8 GPU, 96 CPU, 1000000 MiB)" in out.notes[-1]
    parse_job_spec(out.spec, topology_levels=None)
    with pytest.raises(ValueError, match="no live node"):
        whole_node_shape([])


@pytest.mark.parametrize(
    ("partition", "queue"),
    [("research", "research"), ("kempner_project", "kempner-project"), ("GPU.long", "gpu-long")],
)
def test_a_partition_name_is_the_queue_of_that_name(partition: str, queue: str) -> None:
    spec = translate(f"#!/bin/sh\n#SBATCH -p {partition}\ntrue\n", "p.sh").spec
    assert spec["queue"] == queue
    parse_job_spec(spec)  # a valid queue name


def test_several_partitions_are_refused_naming_the_rule() -> None:
    with pytest.raises(SbatchError, match=r"p\.sh:2: --partition=a,b: one partition"):
        translate("#!/bin/sh\n#SBATCH --partition=a,b\ntrue\n", "p.sh")


def test_overcommit_asks_one_cpu_per_node_whatever_the_tasks() -> None:
    script = "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=8 -c 4 --overcommit\nsrun true\n"
    spec = translate(script, "o.sh").spec
    assert spec["resources"]["cpu"] == 1
    without = translate(script.replace(" --overcommit", ""), "o.sh").spec
    assert without["resources"]["cpu"] == 32  # 8 tasks of 4 CPUs


@pytest.mark.parametrize(
    ("option", "plugin"),
    [("--image=nersc/pytorch:23", "Shifter"), ("--container-image=nvcr.io/x", "pyxis")],
)
def test_a_site_plugin_option_is_refused_as_what_it_is(option: str, plugin: str) -> None:
    with pytest.raises(SbatchError, match=f"{plugin} plugin option, not sbatch's"):
        translate(f"#!/bin/sh\n#SBATCH {option}\ntrue\n", "c.sh")


@pytest.mark.parametrize(
    ("options", "nodes"),
    [
        ("--constraint=a100", {"features": "a100"}),
        ("-C 'volta32gb&ib'", {"features": "volta32gb&ib"}),
        ("-C [rack1|rack2]", {"features": "[rack1|rack2]"}),
        ("--gres=gpu:a100:8", {"gpu_model": "a100"}),
        ("--gpus-per-node=h100:8", {"gpu_model": "h100"}),
        ("-N 2 --gpus=h100:16", {"gpu_model": "h100"}),
        ("--gpus-per-task=v100:1", {"gpu_model": "v100"}),
        ("--exclude=ip-26-0-134-66,ip-26-0-140-150", {"exclude": ["ip-26-0-134-66",
                                                                  "ip-26-0-140-150"]}),
        ("-x gpu[07-08]", {"exclude": ["gpu07", "gpu08"]}),
        ("-N 2 -w node[01-02]", {"names": ["node01", "node02"]}),
    ],
)  # fmt: skip
def test_node_selection_options_become_the_specs_nodes(
    options: str, nodes: dict[str, object]
) -> None:
    spec = translate(f"#!/bin/sh\n#SBATCH {options}\ntrue\n", "n.sh").spec
    assert spec["nodes"] == nodes
    parsed = parse_job_spec(spec, topology_levels=None).spec.nodes  # a valid job spec
    assert parsed is not None and parsed.features == nodes.get("features", "")


def test_a_node_list_asks_for_at_least_its_nodes_and_prefer_is_noted() -> None:
    out = translate("#!/bin/sh\n#SBATCH -w gpu[01-03] --prefer=a100\ntrue\n", "w.sh")
    assert out.spec["replicas"] == 3
    assert out.spec["nodes"] == {"names": ["gpu01", "gpu02", "gpu03"]}
    assert any("--prefer=a100: a soft constraint" in note for note in out.notes)
    later = translate("#!/bin/sh\n#SBATCH -w gpu[01-03] -N 1\ntrue\n", "w.sh").spec
    assert later["replicas"] == 3


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("#SBATCH --constraint=a100*2", "--constraint=a100*2: counts (feature*N) are not"),
        ("#SBATCH -C 'a|[b|c]'", "joined to the rest with '&'"),
        ("#SBATCH -w gpu[02-01]", "-w: not a host list: 'gpu[02-01]'"),
        ("#SBATCH -x ./hosts.txt", "a file of host names is not supported"),
    ],
)
def test_node_selection_that_cannot_be_read_is_refused_with_its_line(line: str, says: str) -> None:
    with pytest.raises(SbatchError) as refused:
        translate(f"#!/bin/sh\n{line}\ntrue\n", "s.sh")
    assert refused.value.where == "s.sh:2"
    assert says in str(refused.value)


def test_an_option_with_no_meaning_here_is_refused_saying_why() -> None:
    with pytest.raises(SbatchError, match=r"r\.sh:2: --reservation=hug: no advance reservations"):
        translate("#!/bin/sh\n#SBATCH --reservation=hug\ntrue\n", "r.sh")


def test_dependency_singleton_is_the_specs_singleton() -> None:
    spec = translate("#!/bin/sh\n#SBATCH -d singleton,afterok:12\ntrue\n", "s.sh").spec
    assert spec["dependencies"] == {"singleton": True, "afterok": ["job-000012"]}
    assert parse_job_spec(spec).spec.dependencies is not None


def test_nice_lowers_the_priority_and_deadline_bounds_the_wait() -> None:
    spec = translate("#!/bin/sh\n#SBATCH --nice=20 --deadline=now+2hours\ntrue\n", "n.sh").spec
    assert (spec["priority"], spec["deadline"]) == (-20, "+7200s")
    assert translate("#!/bin/sh\n#SBATCH --nice\ntrue\n", "n.sh").spec["priority"] == -100
    parsed = parse_job_spec(spec).spec
    assert (parsed.priority, parsed.deadline_delay_ms) == (-20, 7_200_000)
    for both in ("--qos=high --nice=5", "--nice=5 --qos=high"):
        with pytest.raises(SbatchError, match="a job has one priority"):
            translate(f"#!/bin/sh\n#SBATCH {both}\ntrue\n", "n.sh")


def test_binding_hints_are_noted_and_what_differs_is_refused_saying_why() -> None:
    out = translate("#!/bin/sh\n#SBATCH --gpu-bind=closest --distribution=block\ntrue\n", "b.sh")
    assert len(out.notes) == 2 and "binding and frequencies are the node's" in out.notes[0]
    for option, why in (
        ("--no-requeue", "always requeued after a disruption"),
        ("--hold", "no holds here"),
        ("--kill-on-invalid-dep=no", "always cancelled here"),
    ):
        with pytest.raises(SbatchError, match=why):
            translate(f"#!/bin/sh\n#SBATCH {option}\ntrue\n", "b.sh")
    assert translate("#!/bin/sh\n#SBATCH --kill-on-invalid-dep=yes\ntrue\n", "b.sh").notes == []


def test_a_shell_variable_on_an_sbatch_line_is_refused_saying_no_shell_reads_it() -> None:
    with pytest.raises(SbatchError, match=r"v\.sh:2: --nodes=\$NUM_NODES: #SBATCH lines are not"):
        translate("#!/bin/sh\n#SBATCH --nodes=$NUM_NODES\ntrue\n", "v.sh")
    spec = translate("#!/bin/sh\ntrue\n", "v.sh", ["--output=$HOME/x.log"]).spec  # a shell's
    assert "$HOME/x.log" in spec["command"]


def test_comment_and_mail_options_are_kept_with_the_job() -> None:
    script = "#!/bin/sh\n#SBATCH --comment='ablation 3' --mail-user=ann@lab.org --mail-type=END\n"
    out = translate(script + "true\n", "m.sh")
    env = out.spec["env"]
    assert env["SYNAPSE_SBATCH_COMMENT"] == "ablation 3"
    assert (env["SYNAPSE_SBATCH_MAIL_USER"], env["SYNAPSE_SBATCH_MAIL_TYPE"]) == (
        "ann@lab.org",
        "END",
    )
    assert sum("no mail is sent" in note for note in out.notes) == 2
