"""`stapo sweep --launcher ray`: each run a Ray job through ``launch/ray/submit.sh``, waited for here.

At most ``max_parallel`` jobs are in flight: verl checks at start-up that the GPUs a run asks for are
free and fails the job otherwise, so submitting a whole grid at once only works where the cluster
holds every run at once. While the jobs run, their status is polled through Ray's job API and each
run's progress is read from its run folder's ``metrics.jsonl`` (which is why ``--out`` must be on
storage the cluster's nodes and this machine share: the job's driver writes the run folder at the
same absolute path). When a job ends, its log is saved as ``trainer.log`` in the run folder, its
start-to-end time, exit state and the machine kinds its driver wrote (``machine.json``: the node's, the model
build's) in ``sweep_run.json``; a failed job's message and log tail are printed. A run whose job is still
pending or running (or succeeded unrecorded) when the sweep is started again is taken over, not submitted a
second time; a failed or stopped one is submitted again
(it resumes from its checkpoint).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from stapo.rundir import read_machine, read_metrics
from stapo.runs.folder import config_value, earlier_segments, read_record, write_record
from stapo.runs.progress import Progress, format_duration
from stapo.sweep.grid import PlannedRun

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
HEARTBEAT_S = 60.0
LOG_TAIL_LINES = 40
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def enable_token_auth() -> None:
    """Ray's client sends the cluster token only with RAY_AUTH_MODE=token: the rule of launch/ray/common.sh."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if (
        os.environ.get("RAY_AUTH_TOKEN")
        or (path and Path(path).is_file() and Path(path).stat().st_size)
        or (Path.home() / ".ray" / "auth_token").is_file()
    ):
        os.environ["RAY_AUTH_MODE"] = "token"


class JobApi:
    """The few calls of Ray's job API the sweep needs (``ray`` is imported only here)."""

    def __init__(self, address: str):
        enable_token_auth()
        from ray.job_submission import JobSubmissionClient

        self.address = address
        try:
            self.client = JobSubmissionClient(address)
        except (ConnectionError, RuntimeError) as error:
            raise SystemExit(
                f"--address {address}: no Ray job API answers there ({error}); give the head's dashboard "
                "address, e.g. http://<head>:8265 (start_head.sh prints it), or set RAY_ADDRESS"
            ) from None

    def info(self, job_id: str):
        """The job's details, None when the cluster does not know it (restarted, or another cluster)."""
        try:
            return self.client.get_job_info(job_id)
        except RuntimeError as error:
            if "404" in str(error) or "does not exist" in str(error):
                return None
            raise

    def logs(self, job_id: str) -> str:
        try:
            return self.client.get_job_logs(job_id)
        except RuntimeError as error:
            return f"(no log: {error})\n"


@dataclass
class Flight:
    """One submitted job being waited for."""

    run: PlannedRun
    job_id: str
    overrides: list[str]
    label: str
    progress: Progress
    status: str = "PENDING"
    steps_seen: set[int] = field(default_factory=set)
    last_news: float = field(default_factory=time.monotonic)


def new_job_id(run: PlannedRun) -> str:
    return f"stapo-sweep-{run.run_dir.parent.name}-s{run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"[:120]


def submit(run: PlannedRun, overrides: list[str], repo: Path, address: str) -> tuple[str, int, str]:
    """(job id, submit.sh's exit code, its output) for one run, submitted without waiting."""
    job_id = new_job_id(run)
    env = dict(os.environ, STAPO_JOB_ID=job_id, STAPO_WAIT="0", RAY_ADDRESS=address)
    command = ["bash", str(repo / "launch" / "ray" / "submit.sh"), *overrides]
    proc = subprocess.run(command, check=False, cwd=repo, env=env, capture_output=True, text=True, errors="replace")
    return job_id, proc.returncode, proc.stdout + proc.stderr


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines()[-lines:])


def report_progress(flight: Flight) -> None:
    """New steps of the run folder's metrics as progress lines; a heartbeat while nothing changes."""
    try:
        steps = read_metrics(flight.run.run_dir)
    except FileNotFoundError:
        steps = {}
    if not flight.progress.total_steps:
        total = config_value(flight.run.run_dir, "trainer.total_training_steps")
        flight.progress.total_steps = total if isinstance(total, int) else 0
        test_freq = config_value(flight.run.run_dir, "trainer.test_freq")  # the ETA counts validations too
        flight.progress.test_freq = test_freq if isinstance(test_freq, int) else 0
    for step in sorted(set(steps) - flight.steps_seen):
        flight.steps_seen.add(step)
        print(flight.progress.line(step, steps[step]), flush=True)
        flight.last_news = time.monotonic()
    if time.monotonic() - flight.last_news >= HEARTBEAT_S:
        elapsed = format_duration(time.monotonic() - flight.progress.started)
        print(f"[{flight.label}] ... job {flight.status.lower()}, {elapsed} since submission", flush=True)
        flight.last_news = time.monotonic()


def finish(api: JobApi, flight: Flight, details) -> bool:
    """Save the job's log and outcome in the run folder; True when it succeeded."""
    status = details.status if details is not None else "UNKNOWN"
    status = getattr(status, "value", str(status))
    log = api.logs(flight.job_id) if details is not None else ""
    log_path = flight.run.run_dir / "trainer.log"
    flight.run.run_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as sink:
        sink.write(f"$ ray job {flight.job_id} ({status})\n{log}")
    seconds = None
    segments = [float(s) for s in read_record(flight.run.run_dir).get("segments_s") or []]
    if details is not None and details.start_time and details.end_time:
        segments.append(round((details.end_time - details.start_time) / 1000.0, 1))
        seconds = round(sum(segments), 1)
    ok = status == "SUCCEEDED"
    written = read_machine(flight.run.run_dir)  # by the job's driver, on the node it ran on (none if refused)
    write_record(
        flight.run,
        launcher="ray",
        overrides=flight.overrides,
        job_id=flight.job_id,
        address=api.address,
        status=status,
        returncode=0 if ok else 1,
        seconds=seconds,
        segments_s=segments,
        finished_at=time.time(),
        machine=written.get("machine"),
        model_built_on=written.get("model_built_on"),
    )
    if ok:
        print(f"[{flight.label}] job {flight.job_id} succeeded in {format_duration(seconds or 0)}", flush=True)
        return True
    # Ray appends the log's last 20,000 characters to the message: the first line says what ended it
    message = (getattr(details, "message", None) or "the cluster no longer knows this job").splitlines()[0]
    message = message.split(", last available logs")[0]
    print(
        f"[{flight.label}] job {flight.job_id} {status}: {message}\n"
        f"  log: {log_path} (last {LOG_TAIL_LINES} lines:)\n{tail(log)}",
        flush=True,
    )
    return False


def adopt(api: JobApi, run: PlannedRun) -> tuple[str, str] | None:
    """(job id, status) of this run's earlier job when it is pending, running, or ended well unrecorded.

    A sweep interrupted between a job's success and its record finds that job here and records it
    instead of training the run again; a failed or stopped job is not adopted (it is submitted anew).
    """
    record = read_record(run.run_dir)
    job_id = record.get("job_id")
    if not job_id or record.get("returncode") is not None:
        return None
    details = api.info(job_id)
    status = getattr(details.status, "value", str(details.status)) if details is not None else None
    return (job_id, status) if status in ("PENDING", "RUNNING", "SUCCEEDED") else None


def run_ray_sweep(
    runs: list[tuple[str, PlannedRun]],
    common: list[str],
    repo: Path,
    address: str,
    max_parallel: int,
    poll_s: float,
) -> list[PlannedRun]:
    """Submit ``runs`` (head line, run) at most ``max_parallel`` at a time; wait for all; the failed ones."""
    api = JobApi(address)
    queue = list(runs)
    flying: list[Flight] = []
    failed: list[PlannedRun] = []
    try:
        while queue or flying:
            while queue and len(flying) < max_parallel:
                head, run = queue.pop(0)
                overrides = run.overrides(common)
                label = f"{run.cell} seed {run.seed}"
                earlier = adopt(api, run)
                if earlier:
                    job_id = earlier[0]
                    news = f"job {job_id} of an earlier sweep is {earlier[1].lower()}, taken over"
                else:
                    segments = earlier_segments(run.run_dir)  # a resubmitted run resumes: its time counts
                    job_id, code, output = submit(run, overrides, repo, address)
                    write_record(run, launcher="ray", overrides=overrides, job_id=job_id, submitted_at=time.time(),
                                 segments_s=segments)
                    if code != 0:
                        print(f"{head}: submit.sh failed (exit code {code}):\n{tail(output)}", flush=True)
                        write_record(run, launcher="ray", overrides=overrides, job_id=job_id, returncode=code)
                        failed.append(run)
                        continue
                    news = f"submitted as {job_id}"
                # in flight before it is announced: an interrupt from here on names the job
                flying.append(Flight(run, job_id, overrides, label, Progress(0, label)))
                print(f"{head}: {news}", flush=True)
            time.sleep(poll_s)
            for flight in list(flying):
                details = api.info(flight.job_id)
                status = getattr(details.status, "value", str(details.status)) if details is not None else "UNKNOWN"
                if status != flight.status and status not in ENDED:
                    print(f"[{flight.label}] job {status.lower()}", flush=True)
                flight.status = status
                report_progress(flight)
                if status in ENDED or details is None:
                    flying.remove(flight)
                    if not finish(api, flight, details):
                        failed.append(flight.run)
    except KeyboardInterrupt:
        ids = " ".join(f.job_id for f in flying)
        print(
            f"\n[sweep] interrupted; the jobs in flight keep running on the cluster: {ids or 'none'}\n"
            f"  run the same command again to wait for them, or stop them: ray job stop --address {address} <id>",
            flush=True,
        )
        raise SystemExit(130) from None
    return failed
