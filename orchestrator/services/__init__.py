"""The services the steps use: the front doors, the source's guard, change tracking, the audits after the commit,
health checks, host probes, what a run leaves on the hosts, the storage preflight, estimates, DNS TTLs and records.

They know the domain and the transports; steps and run/ import them, they import no step.
"""
