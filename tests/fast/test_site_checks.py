"""Checks before submitting: sacctmgr's and sinfo's answers parsed, a request checked against
the user's accounts, QOSes and the QOS / association / partition limits, with Slurm's names in
the message; without accounting the check is skipped and says why. The magics, the panel and
the REST POST refuse such a request before anything is submitted."""

from __future__ import annotations

import json

import pytest

from jupyter_slurm_ray.cluster import SlurmRayCluster
from jupyter_slurm_ray.config import SlurmRay
from jupyter_slurm_ray.errors import LimitError, SlurmRayError, SpecError
from jupyter_slurm_ray.registry import Registry
from jupyter_slurm_ray.session import Session
from jupyter_slurm_ray.slurm.accounting import Accounting, forget_cached, load_accounting
from jupyter_slurm_ray.slurm.formats import parse_tres, tres_amount
from jupyter_slurm_ray.slurm.limits import check_against_accounting
from jupyter_slurm_ray.slurm.output import parse_associations, parse_qos, parse_sinfo
from jupyter_slurm_ray.slurm.sitecheck import check_spec, check_with_slurm
from jupyter_slurm_ray.spec import ClusterSpec
from jupyter_slurm_ray.ui.widget import ClusterPanel

from ..helpers.fakeslurm import TESTBED_ASSOCIATIONS, TESTBED_PARTITIONS, TESTBED_QOS
from ..helpers.ipyshell import *  # noqa: F403  (the fixtures ipython_shell and magic)
from ..helpers.ipyshell import one_line_error

PARTITIONS = parse_sinfo("\n".join(TESTBED_PARTITIONS))
ACCOUNTING = Accounting(
    tuple(parse_associations("\n".join(TESTBED_ASSOCIATIONS))),
    parse_qos("\n".join(TESTBED_QOS)),
)


def check(**settings) -> tuple[str, ...]:
    return check_spec(ClusterSpec(time="5", **settings), PARTITIONS, ACCOUNTING)


# -- Slurm's answers ----------------------------------------------------------------------------
def test_sacctmgr_associations_and_qos_parse_with_their_limits():
    (alice,) = ACCOUNTING.associations
    assert (alice.user, alice.account, alice.default_account) == ("alice", "physics", "physics")
    assert alice.qos == ("normal", "short") and alice.default_qos == "normal"
    assert alice.partition is None and alice.admin_level == "None"
    short = ACCOUNTING.qos["short"]
    assert short.max_wall == 600 and short.max_tres_per_job == {"node": "1"}
    assert short.flags == ("DenyOnLimit",)
    assert ACCOUNTING.qos["normal"].max_tres_per_job == {}


def test_a_user_without_associations_has_none():
    assert parse_associations("carol||||||||||\n") == []


def test_tres_lists_and_amounts():
    tres = parse_tres("cpu=4,gres/gpu=2,mem=16G,node=1,billing=4")
    assert tres == {"cpu": "4", "gres/gpu": "2", "mem": "16G", "node": "1", "billing": "4"}
    assert tres_amount("mem", "16G") == 16384 and tres_amount("mem", "4000") == 4000
    assert tres_amount("gres/gpu", "2") == 2 and tres_amount("cpu", "many") is None


def test_sinfo_gives_maxnodes_and_older_lines_still_parse():
    debug, short = PARTITIONS
    assert (debug.max_nodes, short.max_nodes) == (None, 2)
    (old,) = parse_sinfo("debug|up|0/3/0/3|2|6428|gpu:2|infinite|debug*\n")
    assert old.max_nodes is None and old.total_nodes == 3


def test_the_accounts_and_qoses_of_the_user_default_first():
    assert ACCOUNTING.accounts() == ["physics"]
    assert ACCOUNTING.qos_names("physics") == ["normal", "short"]
    assert ACCOUNTING.default_qos("physics") == "normal"


# -- the checks ---------------------------------------------------------------------------------
def test_a_valid_account_and_qos_pass():
    assert check(account="physics", qos="short", nodes=1) == ()
    assert check() == ()  # the defaults: physics, normal


def test_an_account_without_association_is_refused_naming_the_users_accounts():
    with pytest.raises(SpecError) as refused:
        check(account="chemistry")
    assert refused.value.field == "account"
    assert str(refused.value) == (
        "account: 'chemistry' is not allowed; an account of alice: physics (default) "
        "(sacctmgr shows no association of alice with account chemistry)"
    )


def test_a_qos_not_allowed_to_the_user_is_refused():
    with pytest.raises(SpecError, match=r"^qos: 'high' is not allowed; a QOS of alice under "):
        check(qos="high")


def test_over_the_qos_node_limit_names_maxtresperjob():
    with pytest.raises(LimitError) as refused:
        check(qos="short", nodes=2)
    assert refused.value.field == "qos"
    assert str(refused.value) == (
        "qos: 'short' allows at most 1 node per job (MaxTRESPerJob=node=1); you asked for 2"
    )


def test_over_the_qos_maxwall_names_it():
    with pytest.raises(LimitError, match=r"'short' allows at most 00:10:00 per job "):
        check_spec(ClusterSpec(time="20", qos="short"), PARTITIONS, ACCOUNTING)


def test_per_job_totals_count_every_node_and_per_node_limits_apply_per_node():
    accounting = Accounting(
        ACCOUNTING.associations,
        parse_qos("normal||cpu=4,gres/gpu=2|gres/gpu=1||\n"),
    )
    spec = ClusterSpec(time="5", nodes=3, cpus_per_node=2)
    with pytest.raises(LimitError) as cpus:
        check_against_accounting(spec, accounting)
    assert str(cpus.value) == (
        "qos: 'normal' (your default QOS) allows at most 4 CPUs per job "
        "(MaxTRESPerJob=cpu=4); you asked for 6 (3 nodes × 2)"
    )
    with pytest.raises(LimitError, match=r"at most 1 GPU per node \(MaxTRESPerNode"):
        check_against_accounting(ClusterSpec(time="5", gpus_per_node=2), accounting)


def test_an_association_limit_applies_unless_the_qos_sets_its_own():
    associations = parse_associations("alice|physics|physics||normal|normal|00:05:00|node=1||None")
    accounting = Accounting(tuple(associations), parse_qos("normal|00:30:00||||\n"))
    check_against_accounting(ClusterSpec(time="20"), accounting)  # the QOS's MaxWall wins
    with pytest.raises(LimitError) as refused:
        check_against_accounting(ClusterSpec(time="5", nodes=2), accounting)
    assert str(refused.value).startswith(
        "account: 'physics' (the association of alice) allows at most 1 node per job "
        "(MaxTRES=node=1)"
    )


def test_over_the_partition_limits_names_maxtime_and_maxnodes():
    with pytest.raises(SpecError) as time_refused:
        check_spec(ClusterSpec(time="45", partition="short"), PARTITIONS, ACCOUNTING)
    assert str(time_refused.value) == (
        "time: '00:45:00' is not allowed; at most 00:30:00 in partition short (MaxTime=00:30:00)"
    )
    with pytest.raises(SpecError, match=r"at most 2 per job in partition short \(MaxNodes=2\)"):
        check(partition="short", nodes=3)


def test_without_accounting_the_check_is_skipped_and_says_why():
    skipped = Accounting(unavailable="Slurm's accounting did not answer (no slurmdbd)")
    notes = check_spec(ClusterSpec(time="5", account="anything"), PARTITIONS, skipped)
    assert notes == (
        "account and QOS not checked: Slurm's accounting did not answer (no slurmdbd)",
    )


async def test_site_check_asks_sacctmgr_once_each_and_caches_it(slurm, transport):
    slurm.accounting = True
    forget_cached(transport)
    checked = await check_with_slurm(ClusterSpec(time="5", qos="short"), transport)
    await check_with_slurm(ClusterSpec(time="5"), transport)
    assert checked.notes == () and checked.accounting.known
    asked = [" ".join(call) for call in slurm.calls if call[0] == "sacctmgr"]
    assert len(asked) == 2  # the user's associations and the QOSes, once for both checks
    assert any("withassoc" in call and "user=alice" in call for call in asked)


async def test_without_accounting_sacctmgr_fails_and_nothing_is_refused(slurm, transport):
    forget_cached(transport)
    checked = await check_with_slurm(ClusterSpec(time="5", account="chemistry"), transport)
    (note,) = checked.notes
    assert note.startswith("account and QOS not checked: Slurm's accounting did not answer")
    assert "not running a supported accounting_storage plugin" in note
    assert (await load_accounting(transport)).unavailable is not None


# -- where the check runs: the magic, the panel, the REST POST -----------------------------------
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("-A chemistry", "account: 'chemistry' is not allowed; an account of alice: physics"),
        ("-q short -N 2", "qos: 'short' allows at most 1 node per job (MaxTRESPerJob=node=1)"),
        ("-p short -t 45", "at most 00:30:00 in partition short (MaxTime=00:30:00)"),
    ],
)
def test_the_magic_refuses_before_submitting(magic, slurm, transport, options, expected):
    slurm.accounting = True
    forget_cached(transport)
    _, err, error = magic.run(f"%slurm_ray up --name refused {options}")
    assert expected in one_line_error(err) and error is not None
    assert not [call for call in slurm.calls if call[0] == "sbatch"] and slurm.jobs == {}


def test_the_magic_says_when_accounts_were_not_checked(magic, slurm, transport, monkeypatch):
    async def stop_here(self, *args, **options):
        raise SlurmRayError("stopped here by the test")

    forget_cached(transport)
    monkeypatch.setattr(SlurmRayCluster, "up_async", stop_here)  # the check ran; submit nothing
    out, err, _ = magic.run("%slurm_ray up --name skipped")
    assert "note: account and QOS not checked: Slurm's accounting did not answer" in out
    assert "stopped here by the test" in one_line_error(err)


def test_the_panel_offers_the_users_accounts_and_qoses_default_selected(site, slurm, transport):
    slurm.accounting = True
    forget_cached(transport)
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.account.options == (("physics (default)", "physics"),)
        assert panel.qos.options == (("normal (default)", "normal"), ("short", "short"))
        assert (panel.account.value, panel.qos.value) == ("physics", "normal")
        panel.qos.value, panel.nodes.value, panel.walltime.value = "short", 2, "5"
        panel.up()
        assert "MaxTRESPerJob=node=1" in panel.message.value
        assert slurm.jobs == {}
    finally:
        panel.close()


def test_the_panel_without_accounting_says_so(site, slurm, transport):
    forget_cached(transport)
    panel = ClusterPanel(session=Session(SlurmRay()))
    try:
        assert panel.account.options == (("(Slurm's default)", ""),)
        assert "account and QOS not checked" in panel.message.value
    finally:
        panel.close()


async def test_the_rest_post_refuses_over_a_limit_naming_the_field(
    jp_fetch, server_manager, slurm, transport, site
):
    slurm.accounting = True
    forget_cached(transport)
    body = json.dumps({"profile": "testbed", "qos": "short", "nodes": 2})
    response = await jp_fetch(
        "slurm-ray", "api", "clusters", method="POST", body=body, raise_error=False
    )
    answer = json.loads(response.body)
    assert response.code == 400 and answer["field"] == "qos"
    assert "MaxTRESPerJob=node=1" in answer["message"]
    assert slurm.jobs == {} and Registry(site["JUPYTER_SLURM_RAY_STATE_DIR"]).all() == []
