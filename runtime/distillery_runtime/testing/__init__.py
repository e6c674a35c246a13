"""Scaffolding for tests and benchmarks, not used by a job: tiny locally built models, a teacher server
started as a subprocess, reference (full-vocabulary) losses. It ships in the package so `bench/` and users'
own tests can import it; nothing outside this package imports it."""
