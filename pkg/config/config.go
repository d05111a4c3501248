// Package config loads a deployable's configuration struct once, at start,
// from flags and the environment, with defaults, and validates it.
//
// Each deployable declares one struct whose fields carry tags:
//
//	GRPCAddr config.ListenAddr `env:"CONCLAVE_GATEWAY_GRPC_ADDR" default:":50051" help:"agent gRPC listener"`
//
// A numeric setting that must be above zero says so beside its key, and
// Load (and Check) refuse zero or less with an error naming the key:
//
//	Lease time.Duration `env:"CONCLAVE_GATEWAY_LEASE" default:"15s" validate:"positive"`
//
// Load derives a flag from every key (--gateway-grpc-addr), so a setting can
// come from either place; a flag wins over the environment, which wins over
// the default. Every error names the setting's environment key, so a bad
// value stops the binary with one line that says what to fix.
//
// It is hand-written rather than built on go-envconfig because that library
// reports errors by Go field name, which an operator never sees.
package config

import (
	"context"
	"encoding"
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Lookup reads one environment variable: os.LookupEnv in production, a map in
// tests, so that Load never reads the process environment on its own.
type Lookup func(key string) (string, bool)

// Decoder is implemented by setting types that parse and check their own
// values, such as ListenAddr.
type Decoder interface {
	EnvDecode(value string) error
}

// Validator is implemented by configuration structs with cross-field rules.
type Validator interface {
	Validate() error
}

// ErrHelp is returned when the arguments asked for -h or --help; the usage
// has already been written.
var ErrHelp = flag.ErrHelp

// Load fills target (a pointer to a struct) from args and lookup, applies
// defaults to the fields still zero, checks the validate tags (Check), and
// runs the Validate methods of target and its nested structs.
// Usage and flag errors go to usage.
func Load(_ context.Context, target any, name string, args []string, lookup Lookup, usage io.Writer) error {
	rv := reflect.ValueOf(target)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: target must be a pointer to a struct, got %T", target)
	}
	settings := collect(rv.Elem())

	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(usage)
	fromFlags := make(map[string]*flagValue, len(settings))
	var listed []setting
	for _, s := range settings {
		// Structs shared by several services (Common) appear more than once
		// in an all-in-one config; one flag sets them all.
		if _, dup := fromFlags[s.env]; !dup {
			v := &flagValue{isBool: s.field.Kind() == reflect.Bool}
			fromFlags[s.env] = v
			fs.Var(v, FlagName(s.env), s.help)
			listed = append(listed, s)
		}
	}
	fs.Usage = func() { printUsage(usage, name, listed) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ErrHelp
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", name, fs.Arg(0))
	}
	setByFlag := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { setByFlag[f.Name] = true })

	for _, s := range settings {
		value, ok := s.def, true
		switch {
		case setByFlag[FlagName(s.env)]:
			value = fromFlags[s.env].raw
		default:
			if v, found := lookup(s.env); found {
				value = v
			} else {
				// A value the caller set before Load is its own default,
				// e.g. conclave dev binding loopback addresses.
				ok = s.hasDef && s.field.IsZero()
			}
		}
		if !ok {
			continue
		}
		if err := decode(s.field, value); err != nil {
			return fmt.Errorf("invalid setting %s: %w", s.env, err)
		}
	}
	if err := checkRules(settings); err != nil {
		return fmt.Errorf("invalid setting %w", err)
	}
	return validate(rv)
}

// Check checks the validate tags of target's settings (a struct, or a
// pointer to one, and the untagged structs in it), as Load does. A
// Validate method calls it first, so that a configuration built in code,
// not loaded, is held to the same rules. The error names the setting's
// environment key:
//
//	CONCLAVE_GATEWAY_LEASE: must be positive, got 0s
//
// The one rule is "positive": above zero, for a whole number, a number or
// a duration.
func Check(target any) error {
	rv := reflect.ValueOf(target)
	if rv.Kind() == reflect.Pointer {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return fmt.Errorf("config: Check needs a struct, got %T", target)
	}
	return checkRules(collect(rv))
}

// checkRules checks the validate tag of each setting.
func checkRules(settings []setting) error {
	for _, s := range settings {
		if s.rule == "" {
			continue
		}
		if s.rule != "positive" {
			return fmt.Errorf("%s: unknown validate rule %q", s.env, s.rule)
		}
		var positive bool
		switch s.field.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
			positive = s.field.Int() > 0
		case reflect.Float64:
			positive = s.field.Float() > 0 // false for NaN too
		default:
			return fmt.Errorf("%s: validate:\"positive\" on a %s, not a number", s.env, s.field.Type())
		}
		if !positive {
			return fmt.Errorf("%s: must be positive, got %v", s.env, s.field.Interface())
		}
	}
	return nil
}

// flagValue holds a flag's text until Load decodes it into its field, so
// that a bad value is reported with the setting's environment key, the same
// way whether it came from a flag or the environment. A boolean setting's
// flag works bare: --x means --x=true.
type flagValue struct {
	raw    string
	isBool bool
}

func (v *flagValue) String() string {
	if v == nil {
		return ""
	}
	return v.raw
}

func (v *flagValue) Set(s string) error { v.raw = s; return nil }

// IsBoolFlag tells the flag package that the flag needs no value.
func (v *flagValue) IsBoolFlag() bool { return v.isBool }

// FlagTyper is implemented by setting types that name their own kind of
// value in the usage text, such as ListenAddr's host:port.
type FlagTyper interface {
	FlagType() string
}

// flagType is what -h shows a setting takes.
func flagType(field reflect.Value) string {
	if t, ok := field.Addr().Interface().(FlagTyper); ok {
		return t.FlagType()
	}
	if field.Type() == durationType {
		return "duration"
	}
	switch field.Kind() {
	case reflect.Bool:
		return "" // a bare flag; the default says which way it goes
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "int"
	case reflect.Float64:
		return "float"
	case reflect.Slice:
		return "list"
	}
	return "string"
}

// printUsage lists every flag with the kind of value it takes, its default,
// and its environment key.
func printUsage(w io.Writer, name string, settings []setting) {
	fmt.Fprintf(w, "Usage of %s:\n", name)
	for _, s := range settings {
		line := "  --" + FlagName(s.env)
		if t := flagType(s.field); t != "" {
			line += " " + t
		}
		def := s.def
		switch {
		case !s.field.IsZero():
			def = presetText(s.field) // set by the caller before Load, e.g. conclave dev's loopback addresses
		case !s.hasDef && s.field.Kind() == reflect.Bool:
			def = "false"
		}
		details := "env " + s.env
		if def != "" {
			details += ", default " + def
		}
		fmt.Fprintf(w, "%s\n    \t%s (%s)\n", line, s.help, details)
	}
}

// presetText renders a value the caller set before Load as -h shows it.
func presetText(field reflect.Value) string {
	if field.Type() == durationType {
		return time.Duration(field.Int()).String()
	}
	if field.Kind() == reflect.Slice {
		parts := make([]string, field.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(field.Index(i).Interface())
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(field.Interface())
}

// FlagName is the flag a setting's environment key maps to:
// CONCLAVE_GATEWAY_GRPC_ADDR becomes gateway-grpc-addr.
func FlagName(envKey string) string {
	k := strings.TrimPrefix(envKey, "CONCLAVE_")
	return strings.ReplaceAll(strings.ToLower(k), "_", "-")
}

type setting struct {
	env, def, help string
	rule           string // the validate tag
	hasDef         bool
	field          reflect.Value
}

// collect lists the tagged fields of v, descending into untagged structs.
func collect(v reflect.Value) []setting {
	var out []setting
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		env := f.Tag.Get("env")
		if env == "" {
			if f.Type.Kind() == reflect.Struct {
				out = append(out, collect(v.Field(i))...)
			}
			continue
		}
		def, hasDef := f.Tag.Lookup("default")
		help := f.Tag.Get("help")
		if help == "" {
			help = f.Name
		}
		out = append(out, setting{env: env, def: def, hasDef: hasDef, help: help, rule: f.Tag.Get("validate"), field: v.Field(i)})
	}
	return out
}

var durationType = reflect.TypeFor[time.Duration]()

func decode(field reflect.Value, value string) error {
	if d, ok := field.Addr().Interface().(Decoder); ok {
		return d.EnvDecode(value)
	}
	if u, ok := field.Addr().Interface().(encoding.TextUnmarshaler); ok {
		return u.UnmarshalText([]byte(value))
	}
	if field.Type() == durationType {
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("%q is not a duration such as 30s or 5m", value)
		}
		field.SetInt(int64(d))
		return nil
	}
	switch field.Kind() {
	case reflect.String:
		field.SetString(value)
	case reflect.Bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("%q is not true or false", value)
		}
		field.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(value, 10, field.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a whole number", value)
		}
		field.SetInt(n)
	case reflect.Float64:
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", value)
		}
		field.SetFloat(f)
	case reflect.Slice:
		if field.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("unsupported setting type %s", field.Type())
		}
		var items []string
		for item := range strings.SplitSeq(value, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
		field.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("unsupported setting type %s", field.Type())
	}
	return nil
}

// validate runs Validate on v and on every nested struct, innermost first, so
// the shared pieces (Common, Storage) check themselves wherever they are used.
func validate(v reflect.Value) error {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	for i := range v.NumField() {
		f := v.Field(i)
		if v.Type().Field(i).IsExported() && f.Kind() == reflect.Struct {
			if err := validate(f.Addr()); err != nil {
				return err
			}
		}
	}
	if val, ok := v.Addr().Interface().(Validator); ok {
		if err := val.Validate(); err != nil {
			return fmt.Errorf("invalid setting %w", err)
		}
	}
	return nil
}
