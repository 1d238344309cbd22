"""Peers run beside kbroker in the benchmarks and the comparison tests: fetched once into a cache, started on loopback."""
