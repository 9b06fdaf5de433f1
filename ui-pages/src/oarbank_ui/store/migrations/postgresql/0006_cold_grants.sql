-- Fleet dispatch: a claim counts the cold grants made in the last lease to nodes whose claims
-- do not yet say the service is starting (placement's starting copies): found by module and time.
CREATE INDEX attempts_cold ON attempts (module, issued_at) WHERE placement = 'cold';
