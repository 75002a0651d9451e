"""The algorithm: pure functions over tensors, no verl, no files, no command line.

What a rule author reads (docs/algorithm.md):

- ``s2t``: the S2T mask (spurious = A > 0, p < tau_p, H < tau_h) and its per-token inputs.
- ``quantile``: the exact linear quantile over a scope (one process, every DP rank, per mini-batch).
- ``masks``: the token-rule registry (``register_token_mask``): S2T and the other hard masks.
- ``token_weights``: soft per-token weights (TACO, Advantage Reweighting).
- ``custom_rule``: a user's function (a mask or a weight, from a file) as an entry of the ``masks`` registry.
- ``loss``: the policy-gradient loss with the mask folded in and the renormalisation.
- ``lopti``: which of Lopti's two updates a token is in.
- ``stare``, ``steer``, ``dcpo``: the 2026 stabilisers (STARE's and STEER's weights, DCPO's clip bounds).
- ``gradnorm``: the logit-gradient norm analysis (why spurious tokens dominate).
- ``ablation``, ``token_sample``: what a grid of thresholds would have silenced; which tokens a
  diagnostic samples.
- ``validation``: the settings' checks, with errors naming the key and its allowed range.

The verl glue that calls these lives in ``stapo.verl_plugin``; tests/unit/test_algorithm_purity.py
keeps this folder free of verl, Ray, Hydra and the rest of the package (torch and numpy only).
"""
