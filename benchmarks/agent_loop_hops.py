"""The agent-loop worker's per-request hops: verl's Ray calls against the direct paths of ``SharedLoopWorker``.

verl's agent-loop worker makes, for every sample, a Ray call to a reward-loop actor (``_compute_score``: a
one-row DataProto pickled) and two to the global load balancer around the server call (``generate``: acquire,
release). Once a submission is decoded in one batch, that per-request work runs on the worker's one event loop
while the trainer waits, so it is measured here on a concurrent burst of requests (a testbed step's 64, a
validation's 512), in a Ray cluster on loopback, inside an async actor as the worker runs:

- ``reward``: verl's ``_compute_score`` with verl's ``RewardLoopWorker`` actor against the same method with
  ``stapo.verl_plugin.opt_in.local_reward``'s handle (verl's ``RewardLoopWorker`` in the worker's process), the tiny
  preset's rule (stapo.reward.synthetic); the scores are compared.
- ``generate``: verl's ``LLMServerClient.generate`` through verl's ``GlobalRequestLoadBalancer`` actor against
  ``stapo.verl_plugin.opt_in.one_server.OneServerClient``, to a server actor that answers at once (the server's
  decoding is not what is measured).

Each row: the burst's wall time and the CPU seconds of the worker process and of the actor the direct path skips,
medians of interleaved rounds.
"""

from __future__ import annotations

import statistics

from benchmarks.common import fmt_num, md_row

NAME = "hops"
TITLE = "7. The agent-loop worker's per-request hops: verl's reward actor and load balancer against the direct paths"
SIZES = {
    "quick": {"bursts": (8,), "repeats": 1},
    "full": {"bursts": (64, 512), "repeats": 5},
}


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _CpuMeter:
    """Mixed into the measured actors: their process's CPU seconds."""

    def cpu_s(self) -> float:
        return _cpu_s()


def _actors():
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.workers.rollout.replica import TokenOutput
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    @ray.remote(num_cpus=0)
    class Server:
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            return TokenOutput(token_ids=list(prompt_ids[:4]), log_probs=None, extra_fields={"global_steps": 1})

    @ray.remote(num_cpus=0)
    class Balancer(GlobalRequestLoadBalancer, _CpuMeter):
        pass

    @ray.remote(num_cpus=0)
    class Rewarder(RewardLoopWorker, _CpuMeter):
        pass

    @ray.remote(num_cpus=0)
    class Worker(_CpuMeter):
        """The state of a ``SharedLoopWorker`` that ``_compute_score`` reads, and the burst loops."""

        def __init__(self, config, rewarder, balancer):
            from transformers import AutoTokenizer
            from verl.workers.rollout.llm_server import LLMServerClient

            from stapo.verl_plugin.opt_in import local_reward, one_server
            from stapo.verl_plugin.training.shared_agent_loops import SharedLoopWorker

            self.tokenizer = AutoTokenizer.from_pretrained(config.actor_rollout_ref.model.path)
            worker = object.__new__(SharedLoopWorker)
            worker.config, worker.processor, worker.tokenizer, worker.mm_processor_kwargs = (
                config, None, self.tokenizer, {})
            self.worker = worker
            self.handles = {"verl": [rewarder], "direct": local_reward.reward_handles(config, [rewarder])}
            verls = LLMServerClient(config, load_balancer_handle=balancer)
            self.clients = {"verl": verls, "direct": one_server.client_for(config, verls)}

        async def reward_burst(self, variant: str, n: int) -> tuple[float, float, list[float]]:
            import asyncio
            import time

            from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

            self.worker.reward_loop_worker_handles = self.handles[variant]
            prompt = self.tokenizer.encode("what is 2 + 3?")
            outputs, kwargs = [], []
            for i in range(n):
                response = self.tokenizer.encode(f"it is {i % 10}")
                outputs.append(AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * len(
                    response), num_turns=2, metrics=AgentLoopMetrics()))
                kwargs.append({"data_source": "synthetic", "reward_model": {"ground_truth": "5", "style": "rule"},
                               "extra_info": {"index": i}, "raw_prompt": [{"role": "user", "content": "2 + 3?"}],
                               "uid": f"u{i}", "session_id": 0, "global_steps": 1, "index": i})
            cpu, start = _cpu_s(), time.perf_counter()
            await asyncio.gather(*(self.worker._compute_score([o], kwargs=k) for o, k in zip(outputs, kwargs)))
            return time.perf_counter() - start, _cpu_s() - cpu, [o.reward_score for o in outputs]

        async def generate_burst(self, variant: str, n: int) -> tuple[float, float, list]:
            import asyncio
            import time

            client = self.clients[variant]
            cpu, start = _cpu_s(), time.perf_counter()
            outs = await asyncio.gather(*(
                client.generate(f"r{i}", prompt_ids=[i % 50 + 1] * 8, sampling_params={"temperature": 1.0})
                for i in range(n)))
            return time.perf_counter() - start, _cpu_s() - cpu, [o.token_ids for o in outs]

    return Server, Balancer, Rewarder, Worker


def measure(device, bursts, repeats) -> list[dict]:
    import tempfile

    import ray

    from stapo.models.tiny import build_tiny_model
    from tests.recipe_config import config_for_verl

    config = config_for_verl("model_preset=tiny", "stapo.reward_in_agent_loop=true", "stapo.one_server_direct=true")
    config.actor_rollout_ref.model.path = build_tiny_model(tempfile.mkdtemp(prefix="stapo-hops-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        Server, Balancer, Rewarder, Worker = _actors()
        server = Server.remote()
        balancer = Balancer.remote(servers={"only": server})
        rewarder = Rewarder.remote(config)
        worker = Worker.remote(config, rewarder, balancer)
        skipped = {"reward": rewarder, "generate": balancer}
        for hop in ("reward", "generate"):
            burst_of = getattr(worker, f"{hop}_burst")
            for n in bursts:
                ray.get([burst_of.remote(v, n) for v in ("verl", "direct")])  # warm-up: builds, imports, lookups
                samples = {"verl": [], "direct": []}
                answers = {}
                for round_ in range(repeats):
                    for variant in (("verl", "direct") if round_ % 2 == 0 else ("direct", "verl")):
                        other = ray.get(skipped[hop].cpu_s.remote())
                        wall, cpu, answer = ray.get(burst_of.remote(variant, n))
                        other = ray.get(skipped[hop].cpu_s.remote()) - other
                        samples[variant].append((wall, cpu, other))
                        answers.setdefault(variant, answer)
                row = {"bench": NAME, "hop": hop, "requests": n, "same_answers": answers["verl"] == answers["direct"]}
                for variant, values in samples.items():
                    for i, key in enumerate(("wall_s", "worker_cpu_s", "skipped_actor_cpu_s")):
                        row[f"{variant}_{key}"] = statistics.median(v[i] for v in values)
                row["wall_ratio"] = row["direct_wall_s"] / row["verl_wall_s"]
                rows.append(row)
    finally:
        ray.shutdown()
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| hop | requests | verl: wall s | verl: worker CPU s | verl: other actor CPU s | direct: wall s | "
        "direct: worker CPU s | direct: other actor CPU s | wall ratio | same answers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(md_row(
            r["hop"], r["requests"], fmt_num(r["verl_wall_s"]), fmt_num(r["verl_worker_cpu_s"]),
            fmt_num(r["verl_skipped_actor_cpu_s"]), fmt_num(r["direct_wall_s"]), fmt_num(r["direct_worker_cpu_s"]),
            fmt_num(r["direct_skipped_actor_cpu_s"]), fmt_num(r["wall_ratio"]), "yes" if r["same_answers"] else "NO"))
    lines += ["", "A concurrent burst of requests from one async Ray actor in a loopback cluster (`num_cpus=2`); "
              "'other actor' is the reward-loop actor (reward) or the load balancer (generate), which the direct "
              "path no longer calls. Medians of interleaved rounds."]
    return "\n".join(lines)
