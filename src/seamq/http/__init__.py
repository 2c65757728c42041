"""HTTP adapter: the SDS-047 §12 handler contract, both sides."""
