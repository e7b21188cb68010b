"""A cluster's elastic part: its worker jobs, worker groups, scaling, adapt and its policy, Ray's
unmet demand, and walltime rotation."""
