import Logging
import PostgresNIO

/// One schema migration: a version, a name and the statements it runs (in one transaction).
public struct Migration: Sendable {
    public var version: Int
    public var name: String
    public var statements: [String]

    /// A fingerprint of the statements, stored with the version so that an edited, already-applied migration is
    /// detected instead of silently skipped.
    var sql: String { statements.joined(separator: ";\n") }
}

/// The versioned schema of the sink. Table names are part of the product (dashboards and SQL users rely on them);
/// never edit an applied migration: append a new one.
///
/// Time columns are `timestamptz` derived from Apple's milliseconds; the ordering keys are also kept as exact
/// `bigint` milliseconds (`*_ms`) because every monotonic guard compares them.
public enum SinkSchema {
    public static let migrations: [Migration] = [
        Migration(version: 1, name: "initial schema", statements: [
            // Apple milliseconds -> timestamptz (exact to the millisecond: to_timestamp rounds to microseconds).
            """
            CREATE FUNCTION fleet_ms(ms bigint) RETURNS timestamptz
                LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
                AS $$ SELECT to_timestamp(ms::double precision / 1000) $$
            """,
            // Every notification, once per notificationUUID (seed 001: keep them all so they can be traced later;
            // originalTransactionId is the parent record, notifications its children).
            """
            CREATE TABLE notifications (
                notification_uuid       text PRIMARY KEY,
                environment             text NOT NULL,
                notification_type       text NOT NULL,
                subtype                 text,
                version                 text,
                bundle_id               text,
                app_apple_id            bigint,
                original_transaction_id text,
                transaction_id          text,
                signed_date             timestamptz NOT NULL,
                signed_date_ms          bigint NOT NULL,
                payload                 jsonb NOT NULL,
                source_topic            text NOT NULL,
                source_partition        integer NOT NULL,
                source_offset           bigint NOT NULL,
                received_at             timestamptz NOT NULL,
                applied_at              timestamptz NOT NULL
            )
            """,
            "CREATE INDEX notifications_parent ON notifications (environment, original_transaction_id, signed_date_ms)",
            "CREATE INDEX notifications_type ON notifications (notification_type, subtype, signed_date)",
            // Transaction facts: every signed version, and the current one per (environment, transactionId).
            """
            CREATE TABLE transaction_versions (
                environment             text NOT NULL,
                transaction_id          text NOT NULL,
                signed_date_ms          bigint NOT NULL,
                signed_date             timestamptz NOT NULL,
                original_transaction_id text,
                web_order_line_item_id  text,
                bundle_id               text,
                product_id              text,
                product_type            text,
                app_account_token       text,
                ownership_type          text,
                quantity                integer,
                purchase_date           timestamptz,
                original_purchase_date  timestamptz,
                expires_date            timestamptz,
                revocation_date         timestamptz,
                revocation_reason       integer,
                revocation_type         text,
                revocation_percentage   integer,
                is_upgraded             boolean,
                payload                 jsonb NOT NULL,
                event_id                text NOT NULL,
                PRIMARY KEY (environment, transaction_id, signed_date_ms)
            )
            """,
            """
            CREATE TABLE transactions (
                environment             text NOT NULL,
                transaction_id          text NOT NULL,
                signed_date_ms          bigint NOT NULL,
                signed_date             timestamptz NOT NULL,
                original_transaction_id text,
                web_order_line_item_id  text,
                bundle_id               text,
                product_id              text,
                product_type            text,
                app_account_token       text,
                ownership_type          text,
                quantity                integer,
                purchase_date           timestamptz,
                original_purchase_date  timestamptz,
                expires_date            timestamptz,
                revocation_date         timestamptz,
                revocation_reason       integer,
                revocation_type         text,
                revocation_percentage   integer,
                is_upgraded             boolean,
                payload                 jsonb NOT NULL,
                event_id                text NOT NULL,
                PRIMARY KEY (environment, transaction_id)
            )
            """,
            "CREATE INDEX transactions_original ON transactions (environment, original_transaction_id)",
            // The append-only event log dashboards read.
            """
            CREATE TABLE entitlement_events (
                event_id                text PRIMARY KEY,
                status                  text NOT NULL CHECK (status IN ('applied', 'stale', 'duplicate')),
                environment             text NOT NULL,
                kind                    text NOT NULL,
                effect                  text NOT NULL,
                reason                  text,
                subject                 text,
                entitlement             text,
                product_id              text,
                product_type            text,
                transaction_id          text,
                original_transaction_id text,
                web_order_line_item_id  text,
                app_account_token       text,
                ownership_type          text,
                quantity                integer,
                units                   integer,
                valid_from              timestamptz,
                valid_until             timestamptz,
                revocation_date         timestamptz,
                revocation_reason       integer,
                revocation_type         text,
                revocation_percentage   integer,
                notification_uuid       text,
                notification_type       text,
                notification_subtype    text,
                signed_date             timestamptz NOT NULL,
                signed_date_ms          bigint NOT NULL,
                verified_at             timestamptz NOT NULL,
                source_topic            text NOT NULL,
                source_partition        integer NOT NULL,
                source_offset           bigint NOT NULL,
                input_kind              text NOT NULL,
                renewal_info            jsonb,
                app_transaction         jsonb,
                details                 jsonb
            )
            """,
            "CREATE INDEX entitlement_events_subject ON entitlement_events (environment, subject, entitlement, signed_date_ms)",
            "CREATE INDEX entitlement_events_transaction ON entitlement_events (environment, transaction_id)",
            "CREATE INDEX entitlement_events_original ON entitlement_events (environment, original_transaction_id)",
            """
            CREATE FUNCTION fleet_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
            END $$
            """,
            """
            CREATE TRIGGER entitlement_events_append_only BEFORE UPDATE OR DELETE ON entitlement_events
                FOR EACH ROW EXECUTE FUNCTION fleet_append_only()
            """,
            // Current access per (environment, subject, entitlement).
            """
            CREATE TABLE entitlements (
                environment             text NOT NULL,
                subject                 text NOT NULL,
                entitlement             text NOT NULL,
                active                  boolean NOT NULL,
                product_id              text,
                original_transaction_id text,
                transaction_id          text,
                valid_from              timestamptz,
                valid_until             timestamptz,
                revoked_at              timestamptz,
                revocation_reason       text,
                last_signed_date        timestamptz NOT NULL,
                last_signed_date_ms     bigint NOT NULL,
                last_event_id           text NOT NULL,
                last_kind               text NOT NULL,
                last_effect             text NOT NULL,
                updated_at              timestamptz NOT NULL,
                PRIMARY KEY (environment, subject, entitlement)
            )
            """,
            """
            CREATE VIEW entitlements_current AS
                SELECT e.*, e.active AND (e.valid_until IS NULL OR e.valid_until > now()) AS entitled_now
                FROM entitlements e
            """,
            // Consumables: one credit per (environment, transactionId); a debit per refund; a re-credit per reversal.
            """
            CREATE TABLE consumable_ledger (
                environment             text NOT NULL,
                transaction_id          text NOT NULL,
                entry                   text NOT NULL CHECK (entry IN ('credit', 'debit', 'recredit')),
                revocation_key          text NOT NULL,
                subject                 text NOT NULL,
                product_id              text,
                original_transaction_id text,
                amount                  numeric NOT NULL,
                event_id                text NOT NULL,
                signed_date             timestamptz NOT NULL,
                signed_date_ms          bigint NOT NULL,
                PRIMARY KEY (environment, transaction_id, entry, revocation_key)
            )
            """,
            "CREATE INDEX consumable_ledger_subject ON consumable_ledger (environment, subject, product_id)",
            """
            CREATE TRIGGER consumable_ledger_append_only BEFORE UPDATE OR DELETE ON consumable_ledger
                FOR EACH ROW EXECUTE FUNCTION fleet_append_only()
            """,
            """
            CREATE VIEW consumable_balances AS
                SELECT environment, subject, product_id,
                       sum(amount) AS balance,
                       coalesce(sum(amount) FILTER (WHERE entry = 'credit'), 0) AS credited,
                       coalesce(-sum(amount) FILTER (WHERE entry = 'debit'), 0) AS debited,
                       coalesce(sum(amount) FILTER (WHERE entry = 'recredit'), 0) AS recredited,
                       count(DISTINCT transaction_id) AS transactions,
                       max(signed_date) AS last_signed_date
                FROM consumable_ledger
                GROUP BY environment, subject, product_id
            """,
        ]),
        // Upgrades and cross-grades within a subscription group keep the originalTransactionId: the sink finds the
        // other tiers of the same subscription by it to end them when a newer tier is granted.
        Migration(version: 2, name: "entitlements by subscription", statements: [
            "CREATE INDEX entitlements_subscription ON entitlements (environment, original_transaction_id)",
        ]),
        // The decoded payloads (2-4 KB) are TOASTed; lz4 compresses them about twice as fast as the default pglz
        // (measured: ~85 vs ~45 us per notification row on the reference machine), which is most of the sink's
        // insert cost. Skipped, with a notice, on a server built without lz4 (or older than PostgreSQL 14).
        Migration(version: 3, name: "lz4 for payload columns", statements: [
            """
            DO $$
            DECLARE c record;
            BEGIN
                FOR c IN SELECT table_name, column_name FROM information_schema.columns
                         WHERE table_schema = current_schema() AND data_type = 'jsonb'
                           AND table_name IN ('notifications', 'transactions', 'transaction_versions', 'entitlement_events')
                LOOP
                    EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET COMPRESSION lz4', c.table_name, c.column_name);
                END LOOP;
            EXCEPTION WHEN OTHERS THEN
                RAISE NOTICE 'payload columns keep the default compression: %', SQLERRM;
            END
            $$
            """,
        ]),
        // `fleet responder`: one row per CONSUMPTION_REQUEST (by notificationUUID) with the answer sent and Apple's
        // response; the app records consent and, when it knows it, how much was consumed.
        Migration(version: 4, name: "consumption answers", statements: [
            """
            CREATE TABLE consumption_answers (
                notification_uuid       text PRIMARY KEY,
                environment             text NOT NULL,
                transaction_id          text NOT NULL,
                original_transaction_id text,
                subject                 text,
                requested_at            timestamptz NOT NULL,
                deadline_at             timestamptz NOT NULL,
                state                   text NOT NULL CHECK (state IN ('pending', 'sending', 'sent', 'failed', 'expired')),
                attempts                integer NOT NULL DEFAULT 0,
                next_attempt_at         timestamptz NOT NULL,
                request                 jsonb,
                customer_consented      boolean,
                delivery_status         text,
                consumption_percentage  integer,
                refund_preference       text,
                response_status         integer,
                response_error          text,
                sent_at                 timestamptz,
                created_at              timestamptz NOT NULL,
                updated_at              timestamptz NOT NULL
            )
            """,
            "CREATE INDEX consumption_answers_due ON consumption_answers (state, next_attempt_at)",
            """
            CREATE TABLE consumption_consent (
                subject     text PRIMARY KEY,
                consented   boolean NOT NULL,
                recorded_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            """
            CREATE TABLE consumption_usage (
                environment            text NOT NULL,
                transaction_id         text NOT NULL,
                consumption_percentage integer NOT NULL CHECK (consumption_percentage BETWEEN 0 AND 100000),
                updated_at             timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (environment, transaction_id)
            )
            """,
        ]),
        // Index review (issue 16): every index entry costs the sink on each insert (index maintenance was ~28 % of
        // PostgreSQL's time during `bench sink`). Kept: every primary key (idempotence, ON CONFLICT),
        // notifications_parent (tracing a subscription's notifications), entitlement_events_subject (a subject's
        // history), entitlements_subscription (the sink's tier lookup). Dropped: indexes no query of the fleet, the
        // README or the dashboards uses. entitlement_events_transaction becomes partial: its two readers (the
        // sink's consumable-restore lookup and the responder's delivery check) only ask for GRANT / RESTORE events.
        // Notifications by time get a BRIN index instead (they arrive roughly in signing order: nearly free).
        Migration(version: 5, name: "index review for the sink's write rate", statements: [
            "DROP INDEX IF EXISTS notifications_type",
            "CREATE INDEX notifications_signed_brin ON notifications USING brin (signed_date)",
            "DROP INDEX IF EXISTS transactions_original",
            "DROP INDEX IF EXISTS entitlement_events_original",
            "DROP INDEX IF EXISTS entitlement_events_transaction",
            """
            CREATE INDEX entitlement_events_transaction ON entitlement_events (environment, transaction_id)
                WHERE effect IN ('GRANT', 'RESTORE')
            """,
        ]),
        // Every text column compares bytewise (COLLATE "C"): they hold identifiers, codes and Apple's names, which
        // nothing sorts linguistically. A database created with the host's locale (en_US.UTF-8 on most servers)
        // otherwise compares every key of every index insert through strcoll: `fleet bench sink --database-locale
        // en_US.UTF-8` ran 20 % slower on average than on C, with p99 batch over 300 ms (README). Byte order also
        // does not change when the operating system's collation data does (an upgraded glibc silently corrupts
        // indexes on linguistic text keys). Views on these tables (the fleet's and an operator's) are dropped and
        // created again with their definition, options, owner, comment and grants; the indexes on the changed
        // columns are rebuilt (the tables are not rewritten: the type stays text).
        Migration(version: 6, name: "text columns compare bytewise", statements: [
            // The views are kept in a variable, not a temporary table: a role without TEMP can run it too.
            """
            DO $$
            DECLARE
                fleet_tables oid[];
                saved jsonb;
                v record;
                t record;
                g record;
            BEGIN
                SELECT array_agg(c.oid) INTO fleet_tables FROM pg_class c
                WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
                  AND c.relname IN ('notifications', 'transaction_versions', 'transactions', 'entitlement_events',
                                    'entitlements', 'consumable_ledger', 'consumption_answers', 'consumption_consent',
                                    'consumption_usage');
                -- Every view reading these tables, directly or through other views, with its depth.
                WITH RECURSIVE deps(view_oid, depth) AS (
                    SELECT r.ev_class, 1 FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
                    WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
                      AND d.refobjid = ANY (fleet_tables) AND r.ev_class <> d.refobjid
                    UNION
                    SELECT r.ev_class, deps.depth + 1 FROM deps
                    JOIN pg_depend d ON d.refobjid = deps.view_oid AND d.classid = 'pg_rewrite'::regclass
                                    AND d.refclassid = 'pg_class'::regclass
                    JOIN pg_rewrite r ON r.oid = d.objid
                    WHERE r.ev_class <> deps.view_oid
                ), views AS (
                    SELECT view_oid, max(depth) AS depth FROM deps GROUP BY view_oid
                )
                SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'schema_name', n.nspname, 'view_name', c.relname, 'depth', views.depth,
                           'definition', pg_get_viewdef(c.oid), 'owner', pg_get_userbyid(c.relowner),
                           'acl', c.relacl::text[], 'comment', obj_description(c.oid, 'pg_class'), 'options', c.reloptions)), '[]')
                INTO saved
                FROM views JOIN pg_class c ON c.oid = views.view_oid JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.relkind = 'v';
                FOR v IN
                    SELECT * FROM jsonb_to_recordset(saved) AS x(schema_name name, view_name name, depth integer)
                    ORDER BY depth DESC
                LOOP
                    EXECUTE format('DROP VIEW %I.%I', v.schema_name, v.view_name);
                END LOOP;
                -- One ALTER TABLE per table: its indexes are rebuilt once.
                FOR t IN
                    SELECT a.attrelid::regclass AS tbl,
                           string_agg(format('ALTER COLUMN %I TYPE text COLLATE "C"', a.attname), ', ' ORDER BY a.attnum) AS clauses
                    FROM pg_attribute a
                    WHERE a.attrelid = ANY (fleet_tables) AND a.attnum > 0 AND NOT a.attisdropped
                      AND a.atttypid = 'text'::regtype AND a.attcollation <> 'pg_catalog."C"'::regcollation
                    GROUP BY a.attrelid
                LOOP
                    EXECUTE format('ALTER TABLE %s %s', t.tbl, t.clauses);
                END LOOP;
                FOR v IN
                    SELECT * FROM jsonb_to_recordset(saved) AS x(schema_name name, view_name name, depth integer,
                        definition text, owner name, acl text[], comment text, options text[])
                    ORDER BY depth
                LOOP
                    EXECUTE format('CREATE VIEW %I.%I%s AS %s', v.schema_name, v.view_name,
                                   CASE WHEN v.options IS NULL THEN '' ELSE ' WITH (' || array_to_string(v.options, ', ') || ')' END,
                                   v.definition);
                    IF v.owner <> current_user THEN
                        EXECUTE format('ALTER VIEW %I.%I OWNER TO %I', v.schema_name, v.view_name, v.owner);
                    END IF;
                    IF v.comment IS NOT NULL THEN
                        EXECUTE format('COMMENT ON VIEW %I.%I IS %L', v.schema_name, v.view_name, v.comment);
                    END IF;
                    FOR g IN SELECT * FROM aclexplode(v.acl::aclitem[]) a WHERE a.grantee <> v.owner::regrole LOOP
                        EXECUTE format('GRANT %s ON %I.%I TO %s%s', g.privilege_type, v.schema_name, v.view_name,
                                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
                    END LOOP;
                END LOOP;
            END
            $$
            """,
        ]),
        // Keys that lead with their most selective column (issue 16). `environment` has two values; leading with it,
        // every comparison of a B-tree descent compared an equal environment first and then fetched the next column
        // at an offset computed anew (variable-length keys). Led by the identifier, a comparison is one memcmp that
        // differs. The same equality lookups use them (`ON CONFLICT` infers a unique index by its set of columns, not
        // their order). `fleet bench sink`, PostgreSQL's time per 100,000 events (pg_stat_statements, 2 runs each):
        // 3,129-3,200 ms against 3,252-3,600 ms. The indexes are rebuilt, the tables are not rewritten.
        Migration(version: 7, name: "index keys lead with their most selective column", statements: [
            """
            ALTER TABLE transaction_versions DROP CONSTRAINT transaction_versions_pkey,
                ADD CONSTRAINT transaction_versions_pkey PRIMARY KEY (transaction_id, environment, signed_date_ms)
            """,
            """
            ALTER TABLE transactions DROP CONSTRAINT transactions_pkey,
                ADD CONSTRAINT transactions_pkey PRIMARY KEY (transaction_id, environment)
            """,
            """
            ALTER TABLE entitlements DROP CONSTRAINT entitlements_pkey,
                ADD CONSTRAINT entitlements_pkey PRIMARY KEY (subject, environment, entitlement)
            """,
            """
            ALTER TABLE consumable_ledger DROP CONSTRAINT consumable_ledger_pkey,
                ADD CONSTRAINT consumable_ledger_pkey PRIMARY KEY (transaction_id, environment, entry, revocation_key)
            """,
            """
            ALTER TABLE consumption_usage DROP CONSTRAINT consumption_usage_pkey,
                ADD CONSTRAINT consumption_usage_pkey PRIMARY KEY (transaction_id, environment)
            """,
            "DROP INDEX notifications_parent",
            "CREATE INDEX notifications_parent ON notifications (original_transaction_id, environment, signed_date_ms)",
            "DROP INDEX entitlement_events_subject",
            "CREATE INDEX entitlement_events_subject ON entitlement_events (subject, environment, entitlement, signed_date_ms)",
            "DROP INDEX entitlement_events_transaction",
            """
            CREATE INDEX entitlement_events_transaction ON entitlement_events (transaction_id, environment)
                WHERE effect IN ('GRANT', 'RESTORE')
            """,
            "DROP INDEX entitlements_subscription",
            "CREATE INDEX entitlements_subscription ON entitlements (original_transaction_id, environment)",
            "DROP INDEX consumable_ledger_subject",
            "CREATE INDEX consumable_ledger_subject ON consumable_ledger (subject, environment, product_id)",
        ]),
        // `notifications.applied_at` (the batch transaction's start) filled by PostgreSQL: the COPY of a batch's
        // notifications leaves the column out, so it no longer waits for a statement reading `now()` first and can
        // be sent before the batch's reads are answered (`BatchPlan.execute`). `now()` is stable, so the COPY still
        // inserts a page at a time.
        Migration(version: 8, name: "applied_at defaults to the transaction's start", statements: [
            "ALTER TABLE notifications ALTER COLUMN applied_at SET DEFAULT now()",
        ]),
    ]

    /// A fixed key for `pg_advisory_lock`, so that two migrators never run at the same time.
    static let lockKey: Int64 = 0x666C_6565_745F_6D67  // "fleet_mg"

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Applies every migration not yet recorded in `schema_migrations`, each in its own transaction, under a
    /// session advisory lock. Rerunning is a no-op. Returns the versions applied by this call.
    @discardableResult
    public static func migrate(
        connection: PostgresConnection, migrations: [Migration] = SinkSchema.migrations, logger: Logger
    ) async throws -> [Int] {
        try await connection.query("SELECT pg_advisory_lock(\(lockKey))", logger: logger)
        do {
            let applied = try await migrateLocked(connection: connection, migrations: migrations, logger: logger)
            try await connection.query("SELECT pg_advisory_unlock(\(lockKey))", logger: logger)
            return applied
        } catch {
            _ = try? await connection.query("SELECT pg_advisory_unlock(\(lockKey))", logger: logger)
            throw error
        }
    }

    private static func migrateLocked(
        connection: PostgresConnection, migrations: [Migration], logger: Logger
    ) async throws -> [Int] {
        try await connection.query(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """, logger: logger)
        var recorded: [Int: String] = [:]
        for try await (version, checksum) in try await connection.query(
            "SELECT version, checksum FROM schema_migrations", logger: logger
        ).decode((Int, String).self) {
            recorded[version] = checksum
        }
        var applied: [Int] = []
        for migration in migrations.sorted(by: { $0.version < $1.version }) {
            let sql = migration.sql
            let rows = try await connection.query("SELECT md5(\(sql))", logger: logger).collect()
            guard let checksum = try rows.first?.decode(String.self) else {
                throw Failure(description: "cannot compute the checksum of migration \(migration.version)")
            }
            if let existing = recorded[migration.version] {
                guard existing == checksum else {
                    throw Failure(description:
                        "migration \(migration.version) (\(migration.name)) was applied with checksum \(existing)"
                        + " but the code now has \(checksum): applied migrations must never be edited")
                }
                continue
            }
            let version = migration.version
            let name = migration.name
            try await connection.withTransaction(logger: logger) { tx in
                for statement in migration.statements {
                    try await tx.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await tx.query(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (\(version), \(name), \(checksum))",
                    logger: logger)
            }
            logger.info("applied migration", metadata: ["version": "\(version)", "name": "\(name)"])
            applied.append(version)
        }
        return applied
    }

    /// The highest applied version, or nil when the database has never been migrated.
    public static func currentVersion(connection: PostgresConnection, logger: Logger) async throws -> Int? {
        let exists = try await connection.query(
            "SELECT to_regclass('schema_migrations') IS NOT NULL", logger: logger
        ).collect()
        guard try exists.first?.decode(Bool.self) == true else { return nil }
        let rows = try await connection.query("SELECT max(version) FROM schema_migrations", logger: logger).collect()
        return try rows.first?.decode(Int?.self)
    }
}
