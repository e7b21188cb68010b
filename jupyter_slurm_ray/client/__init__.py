"""The client side of a cluster, in the user's process: how it connects (Ray Client or as a Ray
driver through a Ray node of its own host), its forwards to the head, and Ray's Jobs client."""
