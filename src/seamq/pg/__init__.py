"""PostgreSQL adapter: migrations, named queries, and the repositories of SDS-047 §7."""
