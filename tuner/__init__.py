"""metaltune: the daemon, the search loop, proposers, workloads, fleet, compare and reports."""
__version__ = "0.1.0"
