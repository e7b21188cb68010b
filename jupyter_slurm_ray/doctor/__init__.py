"""``doctor``: whether this site is ready for a cluster, as a checklist with fixes."""
