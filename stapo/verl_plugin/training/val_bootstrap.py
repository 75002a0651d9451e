"""verl's validation bootstrap, vectorised where that changes no bit (``stapo.eval.bootstrap``).

``verl.trainer.ppo.metric_utils.process_validation_metrics`` calls the module's ``bootstrap_metric`` for every
prompt, variable and k; :func:`install` replaces that module attribute with :func:`bootstrap_metric`, which
answers from ``stapo.eval.bootstrap.best_worst_bootstrap`` and hands every other case (majority votes, strings,
NaN) to verl's function unchanged. The STAPO trainer installs it in the process that validates (the driver's
task runner); the logged metrics are the same values as verl's.
"""

from __future__ import annotations

from stapo.eval.bootstrap import best_worst_bootstrap

_MARK = "_stapo_vectorised"


def install() -> None:
    """Replace ``metric_utils.bootstrap_metric`` once per process (a second call finds it replaced)."""
    from verl.trainer.ppo import metric_utils

    if getattr(metric_utils.bootstrap_metric, _MARK, False):
        return
    verls = metric_utils.bootstrap_metric

    def bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
        """Stands in for verl.trainer.ppo.metric_utils.bootstrap_metric (~line 805): the same values."""
        fast = best_worst_bootstrap(data, subset_size, reduce_fns, n_bootstrap, seed)
        return verls(data, subset_size, reduce_fns, n_bootstrap, seed) if fast is None else fast

    setattr(bootstrap_metric, _MARK, True)
    bootstrap_metric.verl_bootstrap_metric = verls
    metric_utils.bootstrap_metric = bootstrap_metric
