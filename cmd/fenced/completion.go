package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

const completionSummary = `Print a completion script for bash, zsh or fish: the commands, the admin
commands and each command's flags, and the values of flags that take one of
a few (--lease-store, --log-level, --log-format).

  bash:  source <(fenced completion bash)     or save it in /etc/bash_completion.d/fenced
  zsh:   source <(fenced completion zsh)      or save it as _fenced in a directory of $fpath
  fish:  fenced completion fish > ~/.config/fish/completions/fenced.fish`

// commandFlags is every command whose flags complete, built by the same
// constructors the commands run with: completion cannot drift from them.
var commandFlags = []struct {
	path string // "dev", "admin floor"
	make func() *command
}{
	{"dev", func() *command { c, _ := newDevCommand(); return c }},
	{"serve", func() *command { c, _ := newServeCommand(); return c }},
	{"exec", func() *command { c, _ := newExecCommand(); return c }},
	{"elect", func() *command { c, _ := newElectCommand(); return c }},
	{"admin raise-floor", func() *command { c, _ := newFloorCommand("raise-floor"); return c }},
	{"admin floor", func() *command { c, _ := newFloorCommand("floor"); return c }},
	{"admin pg-sql", func() *command { c, _ := newPgSQLCommand(); return c }},
	{"admin pg-migrate", func() *command { c, _ := newPgMigrateCommand(); return c }},
	{"locks list", func() *command { c, _ := newLocksCommand("list"); return c }},
	{"locks get", func() *command { c, _ := newLocksCommand("get"); return c }},
	{"locks release", func() *command { c, _ := newLocksCommand("release"); return c }},
}

var (
	topCommands   = []string{"dev", "serve", "exec", "elect", "locks", "admin", "completion", "version", "help"}
	adminCommands = []string{"raise-floor", "floor", "pg-sql", "pg-migrate"}
	// subcommands are the commands that have their own.
	subcommands = []struct {
		cmd  string
		subs []string
	}{{"admin", adminCommands}, {"locks", locksCommands}}
	shells = []string{"bash", "zsh", "fish"}
	// flagValues are the values of flags that take one of a few.
	flagValues = map[string][]string{
		"lease-store": {"redis", "etcd"}, "log-level": {"debug", "info", "warn", "error"},
		"log-format": {"text", "json"}, "etcd-initial-cluster-state": {"new", "existing"},
	}
)

func runCompletion(args []string, stdout io.Writer) error {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintf(stdout, "Usage: fenced completion bash|zsh|fish\n\n%s\n", completionSummary)
		return nil
	}
	if len(args) != 1 || !slices.Contains(shells, args[0]) {
		return usagef("fenced completion", "want one shell: bash, zsh or fish")
	}
	switch args[0] {
	case "bash":
		io.WriteString(stdout, bashCompletion())
	case "zsh":
		io.WriteString(stdout, "#compdef fenced\n# zsh completion for fenced, through bash's: fenced completion zsh\nautoload -U +X bashcompinit && bashcompinit\n"+bashCompletion())
	case "fish":
		io.WriteString(stdout, fishCompletion())
	}
	return nil
}

// flagsOf lists a command's flags as --name, and whether each takes a value.
func flagsOf(c *command) (names []string, takesValue map[string]bool) {
	takesValue = map[string]bool{}
	c.fs.VisitAll(func(f *flag.Flag) {
		names = append(names, "--"+f.Name)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			takesValue[f.Name] = true
		}
	})
	return names, takesValue
}

func bashCompletion() string {
	var b strings.Builder
	b.WriteString(`# bash completion for fenced: source <(fenced completion bash)
_fenced() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]}
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "` + strings.Join(topCommands, " ") + `" -- "$cur"))
		return
	fi
	case "$cmd" in
`)
	for _, g := range subcommands {
		fmt.Fprintf(&b, "\t%s)\n\t\tif [ \"$COMP_CWORD\" -eq 2 ]; then\n\t\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\t\treturn\n\t\tfi\n\t\tcmd=\"%s ${COMP_WORDS[2]}\"\n\t\t;;\n",
			g.cmd, strings.Join(g.subs, " "), g.cmd)
	}
	b.WriteString(`	completion)
		COMPREPLY=($(compgen -W "` + strings.Join(shells, " ") + `" -- "$cur"))
		return
		;;
	help)
		COMPREPLY=($(compgen -W "` + strings.Join(topCommands, " ") + `" -- "$cur"))
		return
		;;
	esac
	case "$prev" in
`)
	var valued []string
	for f := range flagValues {
		valued = append(valued, f)
	}
	slices.Sort(valued)
	for _, f := range valued {
		fmt.Fprintf(&b, "\t--%s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", f, strings.Join(flagValues[f], " "))
	}
	b.WriteString("\tesac\n\tcase \"$cur\" in\n\t-*) ;;\n\t*) COMPREPLY=(); return ;; # a flag's value or an argument: files\n\tesac\n\tlocal flags=\n\tcase \"$cmd\" in\n")
	for _, c := range commandFlags {
		names, _ := flagsOf(c.make())
		fmt.Fprintf(&b, "\t%q) flags=%q ;;\n", c.path, strings.Join(append(names, "--help"), " "))
	}
	b.WriteString("\tesac\n\tCOMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n}\ncomplete -o default -F _fenced fenced\n")
	return b.String()
}

func fishCompletion() string {
	var b strings.Builder
	b.WriteString("# fish completion for fenced: fenced completion fish > ~/.config/fish/completions/fenced.fish\ncomplete -c fenced -f\n")
	desc := map[string]string{
		"dev": "one process, nothing else needed", "serve": "real deployments", "exec": "hold a lock while a command runs",
		"admin": "token floor and the Postgres fence", "locks": "list, inspect and force-release locks",
		"completion": "print a shell completion script",
		"version":    "print the version", "help": "print the usage",
	}
	for _, c := range topCommands {
		fmt.Fprintf(&b, "complete -c fenced -n __fish_use_subcommand -a %s -d %s\n", c, fishQuote(desc[c]))
	}
	for _, g := range subcommands {
		for _, a := range g.subs {
			fmt.Fprintf(&b, "complete -c fenced -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %s\n",
				g.cmd, strings.Join(g.subs, " "), a)
		}
	}
	fmt.Fprintf(&b, "complete -c fenced -n '__fish_seen_subcommand_from completion' -a '%s'\n", strings.Join(shells, " "))
	for _, c := range commandFlags {
		cond := "__fish_seen_subcommand_from " + c.path
		if group, sub, ok := strings.Cut(c.path, " "); ok {
			cond = "__fish_seen_subcommand_from " + group + "; and __fish_seen_subcommand_from " + sub
		}
		cmd := c.make()
		cmd.fs.VisitAll(func(f *flag.Flag) {
			_, usage := flag.UnquoteUsage(f)
			usage, _, _ = strings.Cut(usage, "\n")
			line := fmt.Sprintf("complete -c fenced -n '%s' -l %s -d %s", cond, f.Name, fishQuote(usage))
			if vs, ok := flagValues[f.Name]; ok {
				line += " -x -a '" + strings.Join(vs, " ") + "'"
			} else if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				line += " -r -F"
			}
			b.WriteString(line + "\n")
		})
	}
	return b.String()
}

func fishQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
