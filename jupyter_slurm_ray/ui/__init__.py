"""What people see and type: the ``%slurm_ray`` magics and their arguments, the commands they
share with the CLI, the panel, the live view, the reprs, and the formatting of all of them."""
