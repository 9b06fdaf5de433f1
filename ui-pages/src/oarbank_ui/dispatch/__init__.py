"""Fleet dispatch: jobs submitted to the portal, claimed by nodes where their model is warm
(contract section 10)."""
