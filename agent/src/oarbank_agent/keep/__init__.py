"""Endpoint services kept warm across an agent restart (``--keep-services``): the keeper
process that holds their channels' ends, the record that names each service, the decision
whether a restarted agent takes one back."""
