"""``gcache.master``: the Raft group that tracks data servers (ARCHITECTURE §3 Master)."""
