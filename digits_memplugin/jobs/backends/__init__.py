"""Where an attempt runs: children of this server, or Ray jobs on a cluster's nodes."""
