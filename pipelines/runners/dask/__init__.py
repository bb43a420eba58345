"""Beam on a Dask cluster: the runner, its combine, partitions, heap trim and job watching (needs ``colaflow[dask]``)."""
