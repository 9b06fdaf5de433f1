"""A stand-in for upstream's ``oarbank_sdk`` package, for tests only: it holds just
``service_endpoint`` (see that module). Never installed; a test puts this folder on the path of
an interpreter that cannot see ours."""
