"""Train roles as groups of ranks: one Ray actor per rank, ``torch.distributed`` underneath (docs/ranks.md).

- ``miles/config/rank_layout.py`` (in configuration, so the argument validator can use it): how many ranks a role
  has, where each one goes, and the startup rules;
- ``placement.py``: reserving a role's CPU bundles in Ray, or a clear error after the placement timeout;
- ``process_group.py``: the rendezvous (rank 0 picks the address) and the bounded-timeout process group;
- ``data_parallel.py``: what a rank does differently in the step loop: its slice of each step, the gradient
  all-reduce, the metric reduction (a null object for one rank, so the loop never branches on the rank);
- ``role.py``: the driver's handle of a role: its placement group, its rank actors, and verbs that fan out to
  every rank and return one object reference.
"""
