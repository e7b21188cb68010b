"""One cluster's job: its settings' checks, its script, its environment, its job dir, the files
shipped into it, environment packs, submission, and what ended jobs leave on disk."""
