package hybrid

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Flag maps one parameter to a command-line argument, e.g. issue_number to
// --issue. A boolean parameter becomes the bare flag when true and nothing
// when false (--dry-run); a string or number becomes --flag=value.
type Flag struct {
	Param string
	Flag  string
}

// Argv returns the agent's arguments for params: the mapped flags in the
// order given. Values are joined to their flag with "=" so that a value
// starting with "-" can never be taken for another option. Parameters absent
// or null are left out; the complete parameters still reach stdin.
func Argv(flags []Flag, params map[string]any) ([]string, error) {
	var argv []string
	for _, f := range flags {
		v, ok := params[f.Param]
		if !ok || v == nil {
			continue
		}
		switch x := v.(type) {
		case bool:
			if x {
				argv = append(argv, f.Flag)
			}
		case string:
			if strings.ContainsRune(x, 0) {
				return nil, validationError(RuleParams, fmt.Sprintf("parameter %s contains a NUL character, which no command-line argument can carry", f.Param))
			}
			argv = append(argv, f.Flag+"="+x)
		case json.Number:
			argv = append(argv, f.Flag+"="+x.String())
		case float64:
			argv = append(argv, f.Flag+"="+fmt.Sprint(x))
		default:
			return nil, validationError(RuleParams, fmt.Sprintf("parameter %s is passed as %s and must be a string, number or boolean, got %s", f.Param, f.Flag, jsonType(v)))
		}
	}
	return argv, nil
}

// SortedFlags turns a param→flag map (as in config.yaml) into Flags in a
// stable order.
func SortedFlags(m map[string]string) []Flag {
	flags := make([]Flag, 0, len(m))
	for p, f := range m {
		flags = append(flags, Flag{Param: p, Flag: f})
	}
	sort.Slice(flags, func(i, j int) bool { return flags[i].Param < flags[j].Param })
	return flags
}
