"""The runtime guard: what every trained batch must prove before its optimizer step.

- ``off_policy``: staleness and weight-version provenance, the denominator's checks (snapshot provenance,
  tolerance against the engine's log-probs), and the two families of mismatch metrics;
- ``fingerprint``: the fingerprint of a set of weights, computed by the trainer at each push and by the engine from
  the weights it holds (``display.short`` shows one in a message);
- ``divergence``: non-finite losses, gradients, weights and sampling probabilities, caught before they spread.

Every violation raises ``OffPolicyGuardError`` (or ``DivergenceError``) naming the rollout, the versions and the fix.
"""
