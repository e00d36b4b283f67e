package postgres

import (
	"context"
	"embed"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Beginner starts transactions. *pgxpool.Pool and *pgx.Conn satisfy it; a
// *pgx.Conn is not safe for concurrent use, so share a pool between
// goroutines.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Option configures a [Fence] or a [Column].
type Option func(*config) error

type config struct {
	schema      string
	table       string // the fence table; Fence only
	fenceColumn string // Column only
	txOptions   pgx.TxOptions

	tableSet, fenceColumnSet bool
}

func defaultConfig() config {
	return config{schema: "public", table: "fence_tokens", fenceColumn: "fence_token"}
}

// WithSchema sets the schema that holds the fence table, the schema-version
// table and the fence_admit function (for a Fence) or the guarded table (for
// a Column). The default is "public". A Fence refuses names starting with
// "pg_", which PostgreSQL reserves (it creates the schema); a Column may be
// on a temporary table, in "pg_temp".
func WithSchema(name string) Option {
	return func(c *config) error {
		c.schema = name
		return nil
	}
}

// WithTable sets the name of the fence table of a [Fence]. The default is
// "fence_tokens". A schema holds one fence table, because it holds one
// fence_admit function; keep separate fences in separate schemas.
func WithTable(name string) Option {
	return func(c *config) error {
		c.table, c.tableSet = name, true
		return nil
	}
}

// WithFenceColumn sets the name of the highest-seen-token column of a
// [Column]. The default is "fence_token".
func WithFenceColumn(name string) Option {
	return func(c *config) error {
		c.fenceColumn, c.fenceColumnSet = name, true
		return nil
	}
}

// WithTxOptions sets the options of the transactions that InTx, Admit and
// Migrate begin (Migrate always uses READ COMMITTED). The default is the
// zero pgx.TxOptions: the server's default isolation level, READ COMMITTED
// unless it was changed. A read-only access mode is an error: an admit
// writes.
func WithTxOptions(opts pgx.TxOptions) Option {
	return func(c *config) error {
		if opts.AccessMode == pgx.ReadOnly {
			return fmt.Errorf("%w: WithTxOptions: a read-only transaction cannot admit a token", ErrInvalidOption)
		}
		c.txOptions = opts
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// maxIdentLen is NAMEDATALEN-1: PostgreSQL silently truncates longer names,
// which could make two different names refer to one table.
const maxIdentLen = 63

// checkName validates a name given by the user. inBody marks names that are
// pasted into the dollar-quoted body of fence_admit, where a '$' could end
// the quote.
func checkName(what, name string, inBody bool) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, what)
	case len(name) > maxIdentLen:
		return fmt.Errorf("%w: %s %q is %d bytes long; PostgreSQL allows at most %d", ErrInvalidName, what, name, len(name), maxIdentLen)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%w: %s %q contains a NUL byte", ErrInvalidName, what, name)
	case !utf8.ValidString(name):
		// The server would refuse the statement, later and less clearly.
		return fmt.Errorf("%w: %s %q is not valid UTF-8; a name must be UTF-8 text", ErrInvalidName, what, name)
	case inBody && strings.ContainsRune(name, '$'):
		return fmt.Errorf("%w: %s %q contains '$', which this package does not allow in names used inside fence_admit", ErrInvalidName, what, name)
	}
	return nil
}

// checkSchema validates a schema name as checkName does, and refuses the
// prefix PostgreSQL reserves: CREATE SCHEMA fails for it, and no table of
// the caller's can be in such a schema.
func checkSchema(name string, inBody bool) error {
	if err := checkName("schema", name, inBody); err != nil {
		return err
	}
	if strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("%w: schema %q starts with \"pg_\", which PostgreSQL reserves for its system schemas; choose a name without that prefix", ErrInvalidName, name)
	}
	return nil
}

//go:embed sql/*.sql migrations/*.sql
var sqlFiles embed.FS

// render reads an embedded SQL template and replaces each {{name}} with the
// given, already quoted, identifier. An unknown or unterminated placeholder
// is an error, so that no template can reach the server half filled. The
// template is scanned, not the result: a name may itself hold "{{".
func render(file string, idents map[string]string) (string, error) {
	b, err := sqlFiles.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("postgres: embedded SQL %s: %w", file, err)
	}
	var out strings.Builder
	for rest := string(b); ; {
		i := strings.Index(rest, "{{")
		if i < 0 {
			out.WriteString(rest)
			break
		}
		j := strings.Index(rest[i:], "}}")
		v, ok := "", false
		if j >= 0 {
			v, ok = idents[rest[i+2:i+j]]
		}
		if !ok {
			return "", fmt.Errorf("postgres: embedded SQL %s: unknown placeholder at byte %d", file, len(b)-len(rest)+i)
		}
		out.WriteString(rest[:i])
		out.WriteString(v)
		rest = rest[i+j+2:]
	}
	return strings.TrimSpace(out.String()), nil
}

// renderAll renders several templates with the same identifiers.
func renderAll(idents map[string]string, files map[string]*string) error {
	for f, dst := range files {
		s, err := render(f, idents)
		if err != nil {
			return err
		}
		*dst = s
	}
	return nil
}
