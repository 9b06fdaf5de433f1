-- A digest of the node's last stored report, all but its time (store/write.py): a report
-- that says the same again, in full or as a short "still alive" naming this digest, only
-- refreshes the node's times instead of rewriting its rows.
ALTER TABLE nodes ADD COLUMN rows_digest TEXT;
