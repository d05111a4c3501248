package graph

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
)

// frontMatter is the optional YAML block between "---" lines that opens a
// seed Markdown file.
type frontMatter struct {
	ID         string   `yaml:"id"`
	Type       string   `yaml:"type"`
	Title      string   `yaml:"title"`
	References []string `yaml:"references"`
	DependsOn  []string `yaml:"depends_on"`
}

// MaxImportFile bounds one seed file.
const MaxImportFile = 1 << 20

// ParseMarkdown makes a node of one seed file at rel (a slash path). Front
// matter may set id, type, title, references and depends_on; otherwise the
// type comes from the first directory (architecture, design, code, test or
// tests; anything else is docs), the title from the first "# " heading, and
// the id is the one an approved create at rel would get.
func ParseMarkdown(rel string, content []byte) (Node, error) {
	var fm frontMatter
	text := string(content)
	if rest, ok := strings.CutPrefix(text, "---\n"); ok {
		block, body, found := strings.Cut(rest, "\n---\n")
		if !found {
			return Node{}, fmt.Errorf("%s: front matter has no closing ---", rel)
		}
		dec := yaml.NewDecoder(strings.NewReader(block))
		dec.KnownFields(true)
		if err := dec.Decode(&fm); err != nil {
			return Node{}, fmt.Errorf("%s: front matter: %w", rel, err)
		}
		text = body
	}
	n := Node{ID: fm.ID, Type: fm.Type, Path: rel, Title: fm.Title, References: fm.References, DependsOn: fm.DependsOn,
		ContentHash: HashContent(text), Text: text}
	if n.Type == "" {
		n.Type = "docs"
		switch first, _, _ := strings.Cut(rel, "/"); first {
		case "architecture", "design", "code", "test":
			n.Type = first
		case "tests":
			n.Type = "test"
		}
	}
	if !slices.Contains(policy.TargetTypes, n.Type) {
		return Node{}, fmt.Errorf("%s: type %q is not one of %s", rel, n.Type, strings.Join(policy.TargetTypes, ", "))
	}
	if n.Title == "" {
		n.Title = governance.Title(text)
	}
	if n.Title == "" {
		n.Title = strings.TrimSuffix(path.Base(rel), path.Ext(rel))
	}
	if n.ID == "" {
		n.ID = governance.AssignID(n.Type, rel)
	}
	return n, nil
}

// LoadDir parses every .md file under fsys.
func LoadDir(fsys fs.FS) ([]Node, error) {
	var nodes []Node
	ids := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Size() > MaxImportFile {
			return fmt.Errorf("%s: %d bytes, over %d", p, info.Size(), MaxImportFile)
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		n, err := ParseMarkdown(p, data)
		if err != nil {
			return err
		}
		if other, dup := ids[n.ID]; dup {
			return fmt.Errorf("%s: id %s is also %s's", p, n.ID, other)
		}
		ids[n.ID] = p
		nodes = append(nodes, n)
		return nil
	})
	return nodes, err
}
