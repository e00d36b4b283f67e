-- Refuse to migrate in a read-only transaction (a hot-standby replica, or
-- default_transaction_read_only on): once the migrations are applied,
-- nothing else would fail there, and every admit would.
DO $fenced_read_only$
BEGIN
	IF current_setting('transaction_read_only') = 'on' THEN
		RAISE EXCEPTION 'fence migrations refused: this transaction is read-only, and every admit would fail here'
			USING ERRCODE = 'read_only_sql_transaction',
				HINT = 'Migrate the primary, not a hot-standby replica, and check default_transaction_read_only of the database, the role and the connection.';
	END IF;
END
$fenced_read_only$
