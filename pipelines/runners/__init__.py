"""Where the job runs: runner selection, the Dask runner and the external worker boot."""
