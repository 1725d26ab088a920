"""Planning a job's batch: the search for the largest batch that fits (planner), the decision after a
failed attempt (fallback), and a job's plan on a device (job_plan). Imports only core."""
