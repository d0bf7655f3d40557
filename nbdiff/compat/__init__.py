"""Drop-in shims for the tools nbdiff replaces: change one import, keep your code.

- ``nbdiff.compat.padiff``: ``auto_diff``, ``assign_weight``, ``LayerMap``, ``create_model``, ``add_special_init``;
- ``nbdiff.compat.ppautodiff``: ``autodiff``;
- ``nbdiff.compat.troubleshooter``: ``api_dump_init/start/stop/compare``.

They translate into nbdiff's own API and add nothing of their own; see docs/migrating.md.
"""
