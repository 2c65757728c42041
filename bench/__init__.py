"""seamq benchmarks: every number next to a raw baseline measured in the same run."""
