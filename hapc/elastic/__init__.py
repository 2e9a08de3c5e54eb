"""Plans that outlive their cluster: re-planning when devices are lost, slowed or measured,
straggler reports, and the tooling around checkpoints taken under one plan and read under another."""
