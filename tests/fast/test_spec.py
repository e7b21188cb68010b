"""Specification of ClusterSpec: Slurm time and memory formats, validation, and layer merging."""

from __future__ import annotations

import json
import re
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.spec import (
    TIME_REQUIRED,
    ClusterSpec,
    format_walltime,
    merge_layers,
    parse_memory,
    parse_walltime,
    resolve,
)

MINUTE, HOUR, DAY = 60, 3600, 86400


def raises_spec_error(field: str, value: object):
    """pytest.raises for a SpecError on `field` whose message shows `value`."""
    return pytest.raises(SpecError, match=f"^{field}: {re.escape(repr(value))} is not allowed; ")


# ----------------------------------------------------------------------------- walltime


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30 * MINUTE),  # M
        ("90", 90 * MINUTE),  # M may exceed 59
        ("1440", DAY),
        (45, 45 * MINUTE),  # an int is minutes, as in Slurm
        ("1:30", 1 * MINUTE + 30),  # M:S
        ("90:00", 90 * MINUTE),  # the leading M of M:S may exceed 59
        ("0:30", 30),
        ("1:00:00", HOUR),  # H:M:S
        ("23:59:59", DAY - 1),
        ("00:00:01", 1),
        ("2-12", 2 * DAY + 12 * HOUR),  # D-H
        ("1-0", DAY),
        ("1-00:30", DAY + 30 * MINUTE),  # D-H:M
        ("1-00:30:00", DAY + 30 * MINUTE),  # D-H:M:S
        ("7-23:59:59", 8 * DAY - 1),
        ("365-00:00:00", 365 * DAY),
        (" 30 ", 30 * MINUTE),  # surrounding blanks of a form field
    ],
)
def test_parse_walltime_accepts_every_slurm_form(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize(
    "value",
    [
        -1,
        0,
        "-1",
        "0",
        "0:00",
        "00:00:00",
        "25:99:99x",
        "UNLIMITED",
        "infinite",
        "",
        "   ",
        "1:60",  # seconds < 60
        "1:00:60",
        "1:60:00",  # minutes < 60
        "24:00:00",  # hours < 24 in H:M:S
        "1-24",  # hours < 24 in D-H
        "1-00:60",
        "1:2:3:4",
        "1h",
        "1.5",
        "1-",
        "-1-00:00:00",
        "\u0661\u0662",  # Arabic-Indic digits are digits to Python, not to Slurm
        True,
        1.5,
        None,
    ],
)
def test_parse_walltime_rejects_anything_else(value):
    with raises_spec_error("time", value):
        parse_walltime(value)


def test_parse_walltime_refuses_unlimited_saying_a_finite_walltime_is_needed():
    with pytest.raises(SpecError, match="finite walltime"):
        parse_walltime("UNLIMITED")


def test_parse_walltime_message_lists_the_forms():
    with pytest.raises(SpecError) as info:
        parse_walltime("soon")
    assert "1:00:00" in str(info.value) and "D-H:M:S" in str(info.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1, "00:00:01"),
        (30 * MINUTE, "00:30:00"),
        (HOUR, "01:00:00"),
        (DAY - 1, "23:59:59"),
        (DAY, "1-00:00:00"),
        (DAY + HOUR + MINUTE + 1, "1-01:01:01"),
        (400 * DAY, "400-00:00:00"),
    ],
)
def test_format_walltime_gives_slurms_canonical_form(seconds, text):
    assert format_walltime(seconds) == text


@given(st.integers(min_value=1, max_value=365 * DAY))
def test_format_walltime_round_trips_through_parse_walltime(seconds):
    assert parse_walltime(format_walltime(seconds)) == seconds


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("value", "megabytes"),
    [
        (4000, 4000),  # an int is megabytes, as in Slurm
        ("4000", 4000),
        ("512M", 512),
        ("512m", 512),
        ("16G", 16 * 1024),
        ("16g", 16 * 1024),
        ("16GB", 16 * 1024),
        ("16GiB", 16 * 1024),
        ("1T", 1024 * 1024),
        ("1.5G", 1536),
        ("0.5T", 512 * 1024),
        ("2048K", 2),
        ("1K", 1),  # kilobytes round up to whole megabytes
        ("1025K", 2),
    ],
)
def test_parse_memory_accepts_slurm_sizes(value, megabytes):
    assert parse_memory(value) == megabytes


@pytest.mark.parametrize(
    "value",
    ["lots", "0", 0, -5, "-5", "", "  ", "1.5", "16 G", "16X", "G", "16B", "1e3", True, 1.5, None],
)
def test_parse_memory_rejects_anything_else(value):
    with raises_spec_error("mem_per_node", value):
        parse_memory(value)


# ----------------------------------------------------------------------------- field checks

TIME = {"time": "1:00:00"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "$(id)"),
        ("name", "ray\nx"),
        ("name", "my cluster"),
        ("name", "1ray"),
        ("name", "a" * 65),
        ("name", ""),
        ("name", "hetjob"),
        ("partition", "debug; touch /tmp/x"),
        ("partition", "debug\n#SBATCH --output=/tmp/x"),
        ("partition", ""),
        ("account", "a b"),
        ("qos", "`id`"),
        ("reservation", "$HOME"),
        ("constraint", "a b"),
        ("constraint", "a;b"),
        ("constraint", "'x'"),
        ("constraint", "$x"),
        ("nodes", 0),
        ("nodes", -1),
        ("nodes", 100001),
        ("nodes", True),
        ("nodes", "two"),
        ("nodes", "2.0"),
        ("nodes", 2.0),
        ("cpus_per_node", 0),
        ("gpus_per_node", -1),
        ("mem_per_node", "lots"),
        ("mem_per_node", 0),
        ("exclusive", "maybe"),
        ("exclusive", 1),
        ("time", -1),
        ("time", "25:99:99x"),
        ("time", "UNLIMITED"),
        ("python", "python3; rm -rf ~"),
        ("python", "-c"),
        ("python", "py thon"),
        ("job_dir_root", "relative/jobs"),
        ("job_dir_root", "~/../etc"),
        ("job_dir_root", "/a/../b"),
        ("job_dir_root", "~bob/jobs"),
        ("job_dir_root", "/tmp/$USER"),
        ("port_strategy", "sequential"),
        ("port_range", (1000, 2000)),
        ("port_range", (30000, 20000)),
        ("port_range", (20000, 70000)),
        ("port_range", (20000,)),
        ("port_range", "wide"),
        ("fixed_port_base", 80),
        ("worker_ports", 7),
        ("worker_ports", 10001),
        ("network_interface", "eth0; id"),
        ("network_interface", "a" * 16),
        ("node_ip_address_command", "hostname -i\nid"),
        ("node_ip_address_command", ""),
        ("object_store_memory", 1000),
        ("object_store_memory", "10M"),
        ("object_store_memory", "lots"),
        ("owner_timeout", 1),
        ("owner_timeout", 604801),
        ("owner_timeout", float("nan")),
        ("owner_timeout", "soon"),
        ("start_timeout", 5),
        ("start_timeout", 86401),
        ("walltime_warning", 59),
        ("walltime_warning", 3601),
        ("setup", 3),
        ("setup", [3]),
    ],
)
def test_a_hostile_or_invalid_value_is_refused_naming_field_and_value(field, value):
    with raises_spec_error(field, value):
        ClusterSpec(**{**TIME, field: value})


@pytest.mark.parametrize(
    ("entry", "hint"),
    [
        ("-N 3", "only long options"),
        ("-p", "only long options"),
        ("--nodes 3", "only long options"),
        ("--Nodes=3", "only long options"),
        ("--output=x", "--output is set by jupyter_slurm_ray"),
        ("--outp=x", "--outp abbreviates --output"),
        ("--time=10", "use the time setting"),
        ("--partition=gpu", "use the partition setting"),
        ("--mem=4G", "use the mem_per_node setting"),
        ("--export=NONE", "--export is set"),
        ("--wrap=id", "--wrap is set"),
        ("--job-name=x", "use the name setting"),
        ("--ntasks=4", "one task per node"),
        ("--gpus=2", "use the gpus_per_node setting"),
        ("--array=1-3", "--array is refused"),
        ("--wait", "--wait is refused"),
        ("--mail-user=a\nb", "control characters"),
        ("--mail-user=a\\b", "backslashes"),
        ("--mail-user=xpackjobx", "hetjob"),
    ],
)
def test_extra_sbatch_refuses_options_that_would_escape_or_override(entry, hint):
    with raises_spec_error("extra_sbatch", entry) as info:
        ClusterSpec(**TIME, extra_sbatch=[entry])
    assert hint in str(info.value)


def test_extra_sbatch_accepts_other_long_options_and_keeps_their_values():
    entries = ("--gres=gpu:a100:2", "--mail-type=END", "--contiguous", "--mail-user=it's #1")
    assert ClusterSpec(**TIME, extra_sbatch=list(entries)).extra_sbatch == entries


@pytest.mark.parametrize(
    ("entry", "hint"),
    [
        ("--port=6379", "--port is set"),
        ("--num-cpus=4", "cpus_per_node"),
        ("--object-store-memory=1", "object_store_memory"),
        ("--block", "--block is set"),
        ("-v", "only long options"),
        ("--system-config=\n", "control characters"),
    ],
)
def test_ray_start_args_refuses_what_the_bootstrap_pins(entry, hint):
    with raises_spec_error("ray_start_args", entry) as info:
        ClusterSpec(**TIME, ray_start_args=[entry])
    assert hint in str(info.value)


@pytest.mark.parametrize("name", ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"])
def test_env_refuses_the_token_auth_variables(name):
    with raises_spec_error("env", name) as info:
        ClusterSpec(**TIME, env={name: "disabled"})
    assert "token auth" in str(info.value)


@pytest.mark.parametrize("env", [{"1X": "a"}, {"A-B": "a"}, {"X": "a\nb"}, {"X": None}, "X=1"])
def test_env_refuses_bad_names_and_multi_line_values(env):
    with pytest.raises(SpecError) as info:
        ClusterSpec(**TIME, env=env)
    assert info.value.field == "env"


def test_env_is_normalised_to_sorted_pairs_of_strings():
    spec = ClusterSpec(**TIME, env={"OMP_NUM_THREADS": 4, "A": "x y"})
    assert spec.env == (("A", "x y"), ("OMP_NUM_THREADS", "4"))
    assert spec.env_dict == {"A": "x y", "OMP_NUM_THREADS": "4"}


# ----------------------------------------------------------------------------- normalisation


def test_int_like_strings_from_magics_and_forms_become_ints():
    spec = ClusterSpec(**TIME, nodes="2", cpus_per_node="4", gpus_per_node="1", worker_ports="32")
    assert (spec.nodes, spec.cpus_per_node, spec.gpus_per_node, spec.worker_ports) == (2, 4, 1, 32)


def test_time_is_stored_in_slurms_canonical_form():
    assert ClusterSpec(time="90").time == "01:30:00"
    assert ClusterSpec(time="2-12").time == "2-12:00:00"
    assert ClusterSpec(time=30).time_seconds == 30 * MINUTE


def test_memory_is_stored_in_megabytes_and_object_store_in_bytes():
    spec = ClusterSpec(**TIME, mem_per_node="16G", object_store_memory="2G")
    assert spec.mem_per_node == 16384
    assert spec.object_store_memory == 2 * 1024**3
    assert ClusterSpec(**TIME, object_store_memory=78643200).object_store_memory == 78643200


def test_a_multi_line_setup_string_becomes_lines_without_blanks():
    spec = ClusterSpec(**TIME, setup="module load python\n\n  \r\nsource ~/env/bin/activate\n")
    assert spec.setup == ("module load python", "source ~/env/bin/activate")


@pytest.mark.parametrize("entry", ["module load a\nmodule load b", "source x\r", "source x\x00"])
def test_a_setup_entry_must_be_one_line(entry):
    with raises_spec_error("setup", entry):
        ClusterSpec(**TIME, setup=["module purge", entry])


def test_setup_lines_are_kept_verbatim_as_the_users_own_shell_code():
    lines = ("export X=$(hostname)", "source a && source b  # both")
    assert ClusterSpec(**TIME, setup=lines).setup == lines


def test_flags_accept_booleans_and_form_words():
    assert ClusterSpec(**TIME, exclusive="yes").exclusive is True
    assert ClusterSpec(**TIME, exclusive="false").exclusive is False


def test_port_range_may_be_written_low_dash_high():
    assert ClusterSpec(**TIME, port_range="30000-31000").port_range == (30000, 31000)


# ----------------------------------------------------------------------------- ports


def test_block_size_is_the_named_ray_ports_plus_the_worker_ports():
    # node and object manager, Ray Client, dashboard, two metrics ports; the GCS and the
    # agents take kernel-assigned ports (bootstrap/rayargs.py)
    assert ClusterSpec(worker_ports=64).block_size == 6 + 64


def test_hash_jobid_is_a_port_strategy():
    spec = ClusterSpec(**TIME, port_strategy="hash_jobid", port_range=(20000, 20069))
    assert (spec.port_strategy, spec.block_size) == ("hash_jobid", 70)
    with raises_spec_error("port_range", (20000, 20068)):
        ClusterSpec(**TIME, port_strategy="hash_jobid", port_range=(20000, 20068))


def test_port_range_must_hold_one_block():
    with raises_spec_error("port_range", (20000, 20050)):
        ClusterSpec(**TIME, port_range=(20000, 20050), worker_ports=64)
    assert ClusterSpec(**TIME, port_range=(20000, 20069), worker_ports=64).block_size == 70


def test_fixed_strategy_requires_a_base_port():
    with raises_spec_error("fixed_port_base", None):
        ClusterSpec(**TIME, port_strategy="fixed")
    assert (
        ClusterSpec(**TIME, port_strategy="fixed", fixed_port_base=30000).fixed_port_base == 30000
    )


def test_fixed_port_base_leaves_room_for_its_block():
    with raises_spec_error("fixed_port_base", 65500):
        ClusterSpec(**TIME, port_strategy="fixed", fixed_port_base=65500)
    assert ClusterSpec(**TIME, fixed_port_base=65536 - 70).fixed_port_base == 65466


# ----------------------------------------------------------------------------- completeness


def test_a_spec_without_time_can_be_built_but_is_not_complete():
    spec = ClusterSpec(nodes=2)
    with raises_spec_error("time", None) as info:
        spec.require_complete()
    assert TIME_REQUIRED in str(info.value)


def test_require_complete_returns_the_spec():
    spec = ClusterSpec(**TIME)
    assert spec.require_complete() is spec


# ----------------------------------------------------------------------------- mappings


def test_from_mapping_accepts_dashes_or_underscores():
    spec = ClusterSpec.from_mapping({"time": "10", "gpus-per-node": 1, "cpus_per_node": 2})
    assert (spec.gpus_per_node, spec.cpus_per_node) == (1, 2)


def test_from_mapping_rejects_an_unknown_key_listing_the_allowed_ones():
    with raises_spec_error("gpus_per_nod", 1) as info:
        ClusterSpec.from_mapping({"gpus_per_nod": 1})
    message = str(info.value)
    assert "did you mean gpus_per_node" in message
    assert "walltime_warning" in message and "partition" in message


def test_from_mapping_treats_none_as_the_default():
    assert ClusterSpec.from_mapping({"name": None, "time": "10"}).name == "ray"


def test_from_mapping_rejects_a_setting_spelt_twice():
    with pytest.raises(SpecError) as info:
        ClusterSpec.from_mapping({"cpus-per-node": 1, "cpus_per_node": 2})
    assert info.value.field == "cpus_per_node"


def test_to_dict_is_json_and_round_trips_through_from_mapping():
    spec = ClusterSpec(
        name="analysis",
        time="1-00:30:00",
        partition="gpu",
        account="proj.x",
        qos="normal",
        reservation="maint",
        constraint="a100&(ib|eth)",
        nodes=3,
        cpus_per_node=8,
        gpus_per_node=2,
        mem_per_node="64G",
        exclusive=True,
        extra_sbatch=["--gres=gpu:2", "--mail-user=it's #1"],
        setup="module load cuda\nsource ~/venv/bin/activate",
        python="/opt/py/bin/python3",
        job_dir_root="/scratch/alice/jobs",
        port_strategy="fixed",
        port_range=(30000, 40000),
        fixed_port_base=31000,
        worker_ports=100,
        network_interface="ib0",
        node_ip_address_command="hostname -I | cut -d' ' -f1",
        ray_start_args=["--include-dashboard=true"],
        env={"OMP_NUM_THREADS": "1"},
        object_store_memory="4G",
        owner_timeout=60,
        start_timeout=600,
        walltime_warning=300,
    )
    data = json.loads(json.dumps(spec.to_dict()))
    assert ClusterSpec.from_mapping(data) == spec


def test_replace_validates_the_change():
    spec = ClusterSpec(**TIME)
    assert spec.replace(nodes="4").nodes == 4
    with raises_spec_error("partition", "a;b"):
        spec.replace(partition="a;b")
    with pytest.raises(SpecError, match="not a cluster setting"):
        spec.replace(gpus=1)


def test_specs_are_frozen():
    spec = ClusterSpec(**TIME)
    with pytest.raises(AttributeError):
        spec.nodes = 5  # type: ignore[misc]


# ----------------------------------------------------------------------------- layers

DEFAULTS = {"name": "ray", "nodes": 1}
CONFIG = {"partition": "batch", "time": "30", "account": "proj", "nodes": 2}
PROFILE = {"partition": "gpu", "gpus-per-node": 1, "nodes": 3, "account": None}
ARGUMENTS = {"nodes": 4, "partition": None, "time": None}


def test_resolve_lets_argument_beat_profile_beat_config_beat_default():
    spec, sources = resolve(
        [
            ("default", DEFAULTS),
            ("config", CONFIG),
            ("profile gpu-small", PROFILE),
            ("argument", ARGUMENTS),
        ]
    )
    assert (spec.nodes, spec.partition, spec.account, spec.time) == (4, "gpu", "proj", "00:30:00")
    assert sources["nodes"] == "argument"
    assert sources["partition"] == "profile gpu-small"
    assert sources["gpus_per_node"] == "profile gpu-small"
    assert sources["account"] == "config"  # None in the profile means "not set here"
    assert sources["time"] == "config"
    assert sources["name"] == "default"
    assert sources["qos"] == "default"  # set by no layer


def test_resolve_names_the_layer_that_set_a_bad_value():
    with pytest.raises(SpecError, match=r"\(set by profile big\)$") as info:
        resolve([("config", {"time": "10"}), ("profile big", {"nodes": 0})])
    assert info.value.field == "nodes"


def test_resolve_rejects_unknown_keys_in_any_layer():
    with pytest.raises(SpecError) as info:
        resolve([("config", {"walltime": "10"})])
    assert info.value.field == "walltime"


def test_merge_layers_lets_later_layers_win():
    spec = merge_layers(DEFAULTS, CONFIG, PROFILE, ARGUMENTS)
    assert (spec.nodes, spec.partition, spec.gpus_per_node) == (4, "gpu", 1)


# ----------------------------------------------------------------------------- former names


def test_the_leases_former_name_idle_timeout_warns_and_sets_owner_timeout():
    with pytest.warns(DeprecationWarning, match="idle_timeout is now named owner_timeout") as seen:
        assert ClusterSpec(idle_timeout=60).owner_timeout == 60
    assert seen[0].filename == __file__  # the warning points at the caller's line
    for mapping in ({"idle_timeout": 70}, {"idle-timeout": 70}):
        with pytest.warns(DeprecationWarning, match="owner_timeout") as seen:
            assert ClusterSpec.from_mapping(mapping).owner_timeout == 70
        assert seen[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="owner_timeout"):
        assert ClusterSpec().replace(idle_timeout=80).owner_timeout == 80
    with pytest.warns(DeprecationWarning, match="owner_timeout"):
        spec, sources = resolve(
            [("config", {"owner_timeout": 50}), ("profile p", {"idle_timeout": 90})]
        )
    assert (spec.owner_timeout, sources["owner_timeout"]) == (90, "profile p")
    assert "idle_timeout" not in spec.to_dict() and spec.to_dict()["owner_timeout"] == 90


@pytest.mark.parametrize(
    "make",
    [
        lambda: ClusterSpec(idle_timeout=60, owner_timeout=70),
        lambda: ClusterSpec.from_mapping({"idle_timeout": 60, "owner-timeout": 70}),
        lambda: ClusterSpec.from_mapping({"owner_timeout": 70, "idle_timeout": 60}, stored=True),
        lambda: ClusterSpec().replace(idle_timeout=60, owner_timeout=70),
        lambda: merge_layers({"owner_timeout": 70, "idle_timeout": 60}),
    ],
)
def test_the_lease_setting_under_both_names_is_refused_naming_both(make):
    with pytest.raises(SpecError, match=r"^idle_timeout: 60 is not allowed; .*owner_timeout"):
        make()


def test_a_stored_mapping_with_the_former_name_loads_without_a_warning():
    stored = {**ClusterSpec(time="10").to_dict(), "idle_timeout": 30}
    del stored["owner_timeout"]  # a record written before the rename
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ClusterSpec.from_mapping(stored, stored=True).owner_timeout == 30
