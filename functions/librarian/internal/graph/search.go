package graph

import (
	"context"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// Scored is a node with its relevance to a query.
type Scored struct {
	Node  Node
	Score float64
}

// BM25's usual parameters; a title term counts titleBoost times.
const (
	bm25K1     = 1.2
	bm25B      = 0.75
	titleBoost = 3
)

// Search ranks the nodes of the given types (all types when empty) for
// query with BM25 over title and text, and returns the best limit of those
// that match at all.
func (g *Graph) Search(ctx context.Context, query string, types []string, limit int) ([]Scored, error) {
	nodes, err := g.All(ctx)
	if err != nil {
		return nil, err
	}
	if len(types) > 0 {
		nodes = slices.DeleteFunc(nodes, func(n Node) bool { return !slices.Contains(types, n.Type) })
	}
	return Rank(nodes, query, limit), nil
}

// Rank scores nodes for query with BM25.
func Rank(nodes []Node, query string, limit int) []Scored {
	terms := uniq(Tokens(query))
	if len(terms) == 0 || len(nodes) == 0 || limit <= 0 {
		return nil
	}
	docs := make([]map[string]int, len(nodes))
	lengths := make([]int, len(nodes))
	df := map[string]int{}
	total := 0
	for i, n := range nodes {
		tf := map[string]int{}
		for _, t := range Tokens(n.Title) {
			tf[t] += titleBoost
			lengths[i] += titleBoost
		}
		for _, t := range Tokens(n.Text) {
			tf[t]++
			lengths[i]++
		}
		for _, t := range terms {
			if tf[t] > 0 {
				df[t]++
			}
		}
		docs[i] = tf
		total += lengths[i]
	}
	avg := math.Max(float64(total)/float64(len(nodes)), 1)
	var out []Scored
	for i, tf := range docs {
		score := 0.0
		for _, t := range terms {
			f := float64(tf[t])
			if f == 0 {
				continue
			}
			idf := math.Log(1 + (float64(len(nodes))-float64(df[t])+0.5)/(float64(df[t])+0.5))
			score += idf * f * (bm25K1 + 1) / (f + bm25K1*(1-bm25B+bm25B*float64(lengths[i])/avg))
		}
		if score > 0 {
			out = append(out, Scored{Node: nodes[i], Score: score})
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Score != out[b].Score {
			return out[a].Score > out[b].Score
		}
		return out[a].Node.ID < out[b].Node.ID
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// stopWords are dropped from queries and documents alike.
var stopWords = map[string]bool{"a": true, "an": true, "and": true, "are": true, "as": true, "at": true, "be": true, "by": true,
	"for": true, "from": true, "how": true, "in": true, "is": true, "it": true, "of": true, "on": true, "or": true, "the": true,
	"this": true, "to": true, "was": true, "what": true, "when": true, "where": true, "which": true, "with": true}

// Tokens splits text into lower-case words, without stop words.
func Tokens(text string) []string {
	fields := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	out := fields[:0]
	for _, f := range fields {
		if !stopWords[f] {
			out = append(out, f)
		}
	}
	return out
}

func uniq(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}
