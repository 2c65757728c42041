"""The peers `make bench` measures seamq against: each runs in its own process, configured as
its docs recommend, on the same PostgreSQL and NATS as seamq in the same run."""
