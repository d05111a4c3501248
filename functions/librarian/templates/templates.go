// Package templates holds the content formats that APPROVAL and VALIDATE
// requests for architecture, design and docs must follow (the protocol's
// TEMPLATES.md, one file per target type). Code and tests have none.
package templates

import (
	"embed"
	"strings"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
)

//go:embed *.md
var files embed.FS

// Set is the parsed templates by target type.
type Set map[string]governance.Template

// Load parses every template file.
func Load() (Set, error) {
	entries, err := files.ReadDir(".")
	if err != nil {
		return nil, err
	}
	s := Set{}
	for _, e := range entries {
		text, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, err
		}
		s[strings.TrimSuffix(e.Name(), ".md")] = governance.ParseTemplate("templates/"+e.Name(), string(text))
	}
	return s, nil
}

// Template implements governance.Templates.
func (s Set) Template(targetType string) (governance.Template, bool) {
	t, ok := s[targetType]
	return t, ok
}
