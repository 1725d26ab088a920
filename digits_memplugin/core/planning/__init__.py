"""Planning a job's batch, top-down: a job's plan on a device under the server's policy (job_plan), the decision
after a failed attempt (fallback), what fits on a device, the first plan included (fit), and the search for the
largest batch that fits (planner). Imports only core."""
