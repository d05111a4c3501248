package service

import (
	"context"
	"fmt"
	"os"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/pkg/store"
)

// Admin is the operator's side of the Librarian's state, used by
// `conclave librarian tokens` and `conclave librarian import`: it works on
// the store directly, as only someone holding the store's credentials can.
type Admin struct {
	tokens *access.Tokens
	graph  *graph.Graph
}

// Token roles.
const (
	RoleAgent    = access.RoleAgent
	RoleReviewer = access.RoleReviewer
)

// NewAdmin works on st; its Tables must exist.
func NewAdmin(st store.Store) *Admin {
	return &Admin{tokens: access.New(st), graph: graph.New(st)}
}

// CreateToken issues a bearer token for an agent or a reviewer; the token is
// shown once, only its hash is stored.
func (a *Admin) CreateToken(ctx context.Context, subject, role string) (token, id string, err error) {
	return a.tokens.Create(ctx, subject, role)
}

// RevokeToken revokes a token by id (the part after "lib_", or the whole
// token).
func (a *Admin) RevokeToken(ctx context.Context, idOrToken string) error {
	if id := access.TokenID(idOrToken); id != "" {
		idOrToken = id
	}
	return a.tokens.Revoke(ctx, idOrToken)
}

// Import loads a seed graph from a directory of Markdown files and returns
// how many nodes it wrote.
func (a *Admin) Import(ctx context.Context, dir string) (int, error) {
	nodes, err := graph.LoadDir(os.DirFS(dir))
	if err != nil {
		return 0, fmt.Errorf("import %s: %w", dir, err)
	}
	for _, n := range nodes {
		if err := a.graph.Put(ctx, n); err != nil {
			return 0, err
		}
	}
	return len(nodes), nil
}
