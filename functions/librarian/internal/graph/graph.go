// Package graph is the Librarian's knowledge graph: specifications,
// designs, code, tests and docs as nodes with references and depends-on
// edges, kept in the store. It answers the pipeline's questions (do these
// references exist, what is this target, would these edges close a cycle)
// and ranks nodes for a QUERY with BM25 over titles and text.
package graph

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
)

// Table holds nodes (partition "nodes", by id) and the path index
// (partition "paths", by path).
var Table = store.Table{Name: "librarian-graph"}

const (
	nodesPartition = "nodes"
	pathsPartition = "paths"
	// MaxText is how much of a node's content is kept for ranking.
	MaxText = 16 << 10
	// MaxNodes bounds a walk or a ranking, so that one request's work is
	// bounded however large the graph grows.
	MaxNodes = 5000
)

// Node is one item of the graph.
type Node struct {
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	Path        string    `json:"path,omitempty"`
	Title       string    `json:"title"`
	ContentHash string    `json:"content_hash,omitempty"`
	References  []string  `json:"references,omitempty"`
	DependsOn   []string  `json:"depends_on,omitempty"`
	Text        string    `json:"text,omitempty"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// Edges are the node's outgoing edges of both kinds.
func (n Node) Edges() []string { return append(slices.Clone(n.References), n.DependsOn...) }

// HashContent is the content hash nodes record.
func HashContent(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Graph keeps nodes in a store.
type Graph struct {
	st  store.Store
	now func() time.Time
}

// New returns a Graph over st; Table must exist.
func New(st store.Store) *Graph { return &Graph{st: st, now: time.Now} }

// ErrNotFound is returned for a missing node.
var ErrNotFound = errors.New("graph: no such node")

// Put writes n (replacing the node with its id) and indexes its path. When
// the path moved, the old path's index entry goes.
func (g *Graph) Put(ctx context.Context, n Node) error {
	if n.ID == "" || n.Type == "" {
		return fmt.Errorf("graph: a node needs an id and a type")
	}
	if len(n.Text) > MaxText {
		n.Text = n.Text[:MaxText]
	}
	n.UpdatedAt = g.now().UTC()
	old, err := g.Get(ctx, n.ID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	data, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("graph: encode %s: %w", n.ID, err)
	}
	if _, err := g.st.Put(ctx, Table.Name, store.Item{Key: nodeKey(n.ID), Data: data, Attrs: map[string]string{"type": n.Type}}); err != nil {
		return fmt.Errorf("graph: write %s: %w", n.ID, err)
	}
	if n.Path != "" {
		if _, err := g.st.Put(ctx, Table.Name, store.Item{Key: pathKey(n.Path), Attrs: map[string]string{"id": n.ID}}); err != nil {
			return fmt.Errorf("graph: index %s: %w", n.Path, err)
		}
	}
	if old.Path != "" && old.Path != n.Path {
		return g.st.Delete(ctx, Table.Name, pathKey(old.Path), store.IfAttrEquals("id", n.ID))
	}
	return nil
}

// Delete removes the node and its path index entry.
func (g *Graph) Delete(ctx context.Context, id string) error {
	n, err := g.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := g.st.Delete(ctx, Table.Name, nodeKey(id)); err != nil {
		return fmt.Errorf("graph: delete %s: %w", id, err)
	}
	if n.Path != "" {
		if err := g.st.Delete(ctx, Table.Name, pathKey(n.Path), store.IfAttrEquals("id", id)); err != nil && !errors.Is(err, store.ErrConditionFailed) {
			return err
		}
	}
	return nil
}

// Get returns the node with id.
func (g *Graph) Get(ctx context.Context, id string) (Node, error) {
	it, err := g.st.Get(ctx, Table.Name, nodeKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return Node{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Node{}, fmt.Errorf("graph: read %s: %w", id, err)
	}
	return decode(it)
}

func decode(it store.Item) (Node, error) {
	var n Node
	if err := json.Unmarshal(it.Data, &n); err != nil {
		return n, fmt.Errorf("graph: node %s is corrupt: %w", it.SK, err)
	}
	return n, nil
}

// nodeKey and pathKey keep keys inside DynamoDB's limits: a long client
// value is hashed rather than refused by the store.
func nodeKey(id string) store.Key { return store.Key{PK: nodesPartition, SK: boundedKey(id)} }
func pathKey(p string) store.Key  { return store.Key{PK: pathsPartition, SK: boundedKey(p)} }

func boundedKey(s string) string {
	if s == "" {
		return "\x00empty"
	}
	if len(s) <= 512 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Missing implements governance.Graph.
func (g *Graph) Missing(ctx context.Context, ids []string) ([]string, error) {
	found, err := g.batch(ctx, ids)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, id := range ids {
		if _, ok := found[id]; !ok {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

func (g *Graph) batch(ctx context.Context, ids []string) (map[string]Node, error) {
	keys := make([]store.Key, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, nodeKey(id))
	}
	out := make(map[string]Node, len(ids))
	for len(keys) > 0 {
		n := min(len(keys), store.MaxBatchGet)
		items, err := g.st.BatchGet(ctx, Table.Name, keys[:n])
		if err != nil {
			return nil, fmt.Errorf("graph: read nodes: %w", err)
		}
		keys = keys[n:]
		for _, it := range items {
			node, err := decode(it)
			if err != nil {
				return nil, err
			}
			out[node.ID] = node
		}
	}
	return out, nil
}

// Resolve implements governance.Graph: the node with id, else the node at
// path.
func (g *Graph) Resolve(ctx context.Context, id, path string) (string, error) {
	if id != "" {
		_, err := g.Get(ctx, id)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return "", err
		}
	}
	if path == "" {
		return "", nil
	}
	it, err := g.st.Get(ctx, Table.Name, pathKey(path))
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("graph: read path %s: %w", path, err)
	}
	return it.Attrs["id"], nil
}

// Cycle implements governance.Graph: a breadth-first walk from refs along
// both kinds of edge, one batch read per level, looking for start. It
// returns the shortest cycle start → ... → start.
func (g *Graph) Cycle(ctx context.Context, start string, refs []string) ([]string, error) {
	parent := map[string]string{}
	var frontier []string
	for _, r := range refs {
		if r == start {
			return []string{start, start}, nil
		}
		if _, seen := parent[r]; !seen {
			parent[r] = start
			frontier = append(frontier, r)
		}
	}
	for len(frontier) > 0 && len(parent) < MaxNodes {
		nodes, err := g.batch(ctx, frontier)
		if err != nil {
			return nil, err
		}
		var next []string
		for _, id := range frontier {
			for _, e := range nodes[id].Edges() {
				if e == start {
					return pathBack(parent, id, start), nil
				}
				if _, seen := parent[e]; !seen {
					parent[e] = id
					next = append(next, e)
				}
			}
		}
		frontier = next
	}
	return nil, nil
}

func pathBack(parent map[string]string, last, start string) []string {
	path := []string{start}
	for at := last; at != start; at = parent[at] {
		path = append(path, at)
	}
	slices.Reverse(path[1:])
	return append(path, start)
}

// All returns up to MaxNodes nodes, in id order.
func (g *Graph) All(ctx context.Context) ([]Node, error) {
	var out []Node
	q := store.Query{PK: nodesPartition, Limit: 1000}
	for len(out) < MaxNodes {
		page, err := g.st.Query(ctx, Table.Name, q)
		if err != nil {
			return nil, fmt.Errorf("graph: list nodes: %w", err)
		}
		for _, it := range page.Items {
			n, err := decode(it)
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
		if page.Cursor == "" {
			break
		}
		q.Cursor = page.Cursor
	}
	return out, nil
}
