"""Any cluster ``hccc synth`` reads is synthesised for or refused with a located reason: random
odd shapes (one to four nodes of one to four GPUs, mixed vendors, NICs over unequal GPU groups,
nodes joined or not) and every collective end with exit status 0 and a program, or exit status 1
and an error that names the cluster file, never a traceback or an internal error, and nothing
written on a refusal."""
from __future__ import annotations

import pytest

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_texts import cluster_specs, topo_text
from hccc.cli import main

COLLECTIVES = ["allgather", "reducescatter", "allreduce", "broadcast", "alltoall"]


@pytest.mark.slow     # (the longest of the README's command: in the slow set)
@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cluster_specs(max_nodes=4, max_gpus=4), st.booleans(), st.sampled_from(COLLECTIVES),
       st.sampled_from(["auto", "search"]))
def test_an_odd_cluster_synthesises_or_is_refused_with_a_located_reason(tmp_path_factory, capsys, nodes, joined,
                                                                        collective, method):
    d = tmp_path_factory.mktemp("odd")
    topo = d / "odd.topo"
    topo.write_text(topo_text(nodes, nic_links=joined))
    out = d / "p.rccl"
    if method == "search" and collective == "alltoall":
        method = "auto"                          # the AllToAll has a method of its own
    capsys.readouterr()                          # what an earlier example printed
    rc = main(["synth", str(topo), "--collective", collective, "--method", method, "--time-limit", "5",
               "--no-sim-select", "-o", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err.lower(), err
    # the oracle: every GPU of a node reaches the others through its mesh, and every node the
    # others through the NICs where nodes are joined; nodes not joined cannot reach each other
    reachable = joined or len(nodes) == 1
    if reachable:
        assert rc == 0, err
        assert out.exists() and "def ResCCLAlgo" in out.read_text()
    else:
        assert rc == 1, (rc, err)
        assert not out.exists()
        # every error line is located: it names the cluster file (file:line:col where a line of
        # it is at fault)
        errors = [ln for ln in err.splitlines() if re.search(r"\berror\b", ln)]
        assert errors and all("odd.topo" in ln for ln in errors), err
