package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// envPrefix is the prefix of the environment variable of every flag:
// --max-ttl is FENCED_MAX_TTL.
const envPrefix = "FENCED_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// usageError is a mistake in the command line or the environment: main
// exits with status 2.
type usageError struct {
	cmd string // "fenced serve"
	err error
}

func (e *usageError) Error() string {
	return fmt.Sprintf("%s: %v (run '%s --help' for usage)", e.cmd, e.err, e.cmd)
}

func (e *usageError) Unwrap() error { return e.err }

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, err: fmt.Errorf(format, args...)}
}

// errHelp means the usage was asked for and printed: Run returns nil.
var errHelp = errors.New("help requested")

// command is the flag set of one subcommand, parsed with ContinueOnError,
// with every flag also read from its environment variable.
type command struct {
	fs      *flag.FlagSet
	name    string // "fenced serve"
	args    string // what follows the flags in the usage line
	summary string
	set     map[string]bool   // flags given on the command line or in the environment
	env     map[string]string // of those, the ones the environment gave: their variables
	cmdline map[string]bool   // of those, the ones the command line gave
}

func newCommand(name, args, summary string) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors itself
	fs.Usage = func() {}
	return &command{fs: fs, name: name, args: args, summary: summary,
		set: map[string]bool{}, env: map[string]string{}, cmdline: map[string]bool{}}
}

// exclusion is a group of flags that cannot be given together: each side
// excludes the others. A member is a flag's name, given when its value is
// not empty (a boolean: true), or name=value, given with that value. A
// side of a command that has none of its flags does not count.
type exclusion [][]string

// exclusions are the flags that exclude each other, for every command that
// has them (a flag's name means the same in every command). When the
// command line gives a side, the environment's variables of the other
// sides are ignored, as if unset: a flag on the command line overrides the
// environment, and a variable that a deployment sets (FENCED_WAIT in a
// unit file) blocked a flag an operator gave (--try) instead (defect 139).
// Two sides both from the environment, or both from the command line,
// are left to the checks that refuse them, which name the variables.
// Dependent flags (--tls-cert with --tls-key, --redis-sentinel-addrs with
// --redis-master) are not here: given half on the command line and half in
// the environment, they go together.
var exclusions = []exclusion{
	{{"try"}, {"wait"}}, // fenced exec: runExec
	{{"observe"}, {"value", "wait", "ttl", "grace"}},                                    // fenced elect: runElect
	{{"client-token"}, {"client-token-file"}},                                           // clientOpts.client
	{{"lease-store=etcd"}, redisFlagNames},                                              // fenced serve: runServe
	{{"redis-addr"}, {"redis-sentinel-addrs", "redis-master"}, {"redis-cluster-addrs"}}, // redisFlags.validate
	{{"redis-cluster-addrs"}, {"redis-db"}},                                             // redisFlags.validate
	{ // fenced serve: runServe
		append([]string{"etcd-endpoints"}, externalFlagNames...),
		append([]string{"etcd-data-dir"}, embedFlagNames...),
	},
}

// explainEnv adds to a usage error that names a flag the environment set
// which variable set it: deployments (systemd, Kubernetes, the image) set
// fenced's flags as FENCED_ variables, and an operator told of "--listen"
// looks for a flag nobody passed. Every command that parses flags defers it
// on its error.
func (c *command) explainEnv(err *error) {
	var ue *usageError
	if !errors.As(*err, &ue) {
		return
	}
	msg := ue.err.Error()
	var notes []string
	for _, name := range slices.Sorted(maps.Keys(c.env)) {
		if namesFlag(msg, name) && !strings.Contains(msg, c.env[name]) {
			notes = append(notes, fmt.Sprintf("--%s is set by $%s", name, c.env[name]))
		}
	}
	if len(notes) > 0 {
		*err = &usageError{cmd: ue.cmd, err: fmt.Errorf("%w; %s", ue.err, strings.Join(notes, ", "))}
	}
}

// namesFlag reports whether msg names --name, not a longer flag that
// starts so.
func namesFlag(msg, name string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], "--"+name)
		if j < 0 {
			return false
		}
		end := i + j + 2 + len(name)
		if end == len(msg) || !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz0123456789-", rune(msg[end])) {
			return true
		}
		i = end
	}
}

// parse reads the command line, then the environment variables of the
// flags it did not set: a flag on the command line overrides its
// environment variable, which overrides the default. An empty variable
// counts as unset. A variable of a flag that the command line excludes
// (exclusions) is ignored too. It returns errHelp after printing the usage
// to stdout for --help, and a *usageError for anything wrong, naming the
// flag or the variable. It may be called again with more arguments (flags
// after fenced locks get NAME).
func (c *command) parse(args []string, stdout io.Writer) error {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(stdout)
			return errHelp
		}
		// The flag package says "-name"; the usage says "--name".
		msg := singleDash.ReplaceAllString(err.Error(), "$1--$2")
		if m := badValue.FindStringSubmatch(msg); m != nil {
			msg = strings.TrimSuffix(msg, "parse error") + c.want(m[1])
		}
		return &usageError{cmd: c.name, err: errors.New(msg)}
	}
	for name := range c.onCommandLine(args) {
		c.cmdline[name], c.set[name] = true, true
		delete(c.env, name) // overridden, if an earlier call took it from the environment
	}
	excluded := c.excluded()
	var err error
	c.fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		if env, ok := c.env[f.Name]; ok && excluded(f, os.Getenv(env)) {
			// Taken from the environment by an earlier call, before the
			// command line excluded it: unset again.
			if serr := f.Value.Set(f.DefValue); serr == nil {
				delete(c.env, f.Name)
				delete(c.set, f.Name)
			}
		}
		if c.set[f.Name] {
			return
		}
		env := envName(f.Name)
		v := os.Getenv(env)
		if v == "" || excluded(f, v) {
			// An empty variable is unset, as FENCED_X= in a shell or an
			// env file often means: it set --redis-prefix to "", which
			// fenced dev refused without --redis-addr (defect 139).
			return
		}
		if serr := c.fs.Set(f.Name, v); serr != nil {
			msg := serr.Error()
			if msg == "parse error" {
				msg = c.want(f.Name)
			}
			err = usagef(c.name, "environment variable %s=%q: invalid value for --%s: %s", env, v, f.Name, msg)
			return
		}
		c.set[f.Name] = true
		c.env[f.Name] = env
	})
	return err
}

// onCommandLine returns the flags args sets. It parses args as c.fs did
// (without an error, then), into values that only note the flag: c.fs
// counts the flags set from the environment as set too.
func (c *command) onCommandLine(args []string) map[string]bool {
	seen := map[string]bool{}
	shadow := flag.NewFlagSet(c.name, flag.ContinueOnError)
	shadow.SetOutput(io.Discard)
	c.fs.VisitAll(func(f *flag.Flag) {
		shadow.Var(&noted{name: f.Name, seen: seen, isBool: isBoolFlag(f)}, f.Name, "")
	})
	_ = shadow.Parse(args)
	return seen
}

// noted is a flag value that notes that its flag was given.
type noted struct {
	name   string
	seen   map[string]bool
	isBool bool
}

func (n *noted) Set(string) error { n.seen[n.name] = true; return nil }
func (n *noted) String() string   { return "" }
func (n *noted) IsBoolFlag() bool { return n.isBool }

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// excluded returns whether the environment's value v of a flag is ignored:
// it would give a side of an exclusion another side of which the command
// line gives.
func (c *command) excluded() func(f *flag.Flag, v string) bool {
	out := map[string][]string{} // flag: the members it is on a side excluded as
	for _, ex := range exclusions {
		given := make([]bool, len(ex))
		anyGiven := false
		for i, side := range ex {
			for _, m := range side {
				name, _, _ := strings.Cut(m, "=")
				if f := c.fs.Lookup(name); f != nil && c.cmdline[name] && gives(f, m, f.Value.String()) {
					given[i], anyGiven = true, true
				}
			}
		}
		if !anyGiven {
			continue
		}
		for i, side := range ex {
			if given[i] {
				continue
			}
			for _, m := range side {
				name, _, _ := strings.Cut(m, "=")
				out[name] = append(out[name], m)
			}
		}
	}
	return func(f *flag.Flag, v string) bool {
		for _, m := range out[f.Name] {
			if gives(f, m, v) {
				return true
			}
		}
		return false
	}
}

// gives reports whether value v of flag f gives the exclusion's member m:
// m is f's name and v is not empty (a boolean: true), or m is name=v.
func gives(f *flag.Flag, m, v string) bool {
	if _, want, ok := strings.Cut(m, "="); ok {
		return v == want
	}
	if isBoolFlag(f) {
		b, err := strconv.ParseBool(v)
		return err == nil && b
	}
	return v != ""
}

// singleDash finds the flag names in the flag package's errors.
var singleDash = regexp.MustCompile(`(: |for flag |for )-([A-Za-z])`)

// badValue finds the flag of a "parse error".
var badValue = regexp.MustCompile(`for (?:flag )?--([A-Za-z0-9-]+): parse error$`)

// want says what a flag's value must look like.
func (c *command) want(name string) string {
	f := c.fs.Lookup(name)
	if f == nil {
		return "parse error"
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return "parse error"
	}
	switch g.Get().(type) {
	case time.Duration:
		return "want a duration with a unit, like 500ms, 30s or 5m"
	case bool:
		return "want true or false"
	case int, int64, uint, uint64:
		return "want a whole number"
	}
	return "parse error"
}

// usage prints the usage line, the summary and every flag with its
// default and environment variable.
func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [flags]%s\n\n%s\n\nFlags (each also from its environment variable, unless empty; a flag on the command line wins,\nover its own variable and over those of flags it cannot be given with):\n", c.name, c.args, c.summary)
	c.fs.VisitAll(func(f *flag.Flag) {
		typ, help := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		fmt.Fprintf(w, "%s\n        %s", line, strings.ReplaceAll(help, "\n", "\n        "))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, " [$%s]\n", envName(f.Name))
	})
}

// checkPort checks the port of an address flag: a number up to 65535 and
// at least min, 0 where the port is bound and 0 picks a free one (--listen),
// 1 where it is advertised or dialled. Checked with the flags: url.Parse and
// net.SplitHostPort take any digits, and a bad port failed only when it was
// bound or dialled, without naming the flag, or (etcd endpoints) never.
func checkPort(port string, min uint64) error {
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n < min {
		return fmt.Errorf("port %q: want a number from %d to 65535", port, min)
	}
	return nil
}

// noArgs rejects positional arguments.
func (c *command) noArgs() error {
	if c.fs.NArg() > 0 {
		return usagef(c.name, "unexpected argument %q: this command takes only flags", c.fs.Arg(0))
	}
	return nil
}

// logFlags are --log-level and --log-format.
type logFlags struct {
	level, format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "Log `level`: debug, info, warn or error. Debug logs every HTTP request.")
	fs.StringVar(&l.format, "log-format", "text", "Log `format` on stderr: text or json.")
}

func (l *logFlags) validate(cmd string) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil || !oneOf(strings.ToLower(l.level), "debug", "info", "warn", "error") {
		return usagef(cmd, "--log-level %q: want debug, info, warn or error", l.level)
	}
	if !oneOf(l.format, "text", "json") {
		return usagef(cmd, "--log-format %q: want text or json", l.format)
	}
	return nil
}

func (l *logFlags) logger(w io.Writer) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(l.level)) // validated
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationsAsText}
	if l.format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationsAsText writes durations as Go writes them ("1.5s"), in JSON
// too, where slog would write nanoseconds.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

func oneOf(s string, allowed ...string) bool { return slices.Contains(allowed, s) }
