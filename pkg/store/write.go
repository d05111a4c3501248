package store

import (
	"fmt"
	"time"
)

// Op is one write of Store.Write: a put, a delete or a counter add, on any
// table. Build it with PutOp, DeleteOp or AddOp.
type Op struct {
	table     string
	kind      opKind
	item      Item // put: the item; delete, add: its Key
	conds     []Condition
	delta     int64
	expiresAt time.Time
}

type opKind int

const (
	opPut opKind = iota + 1
	opDelete
	opAdd
)

// PutOp is Put as part of a Write.
func PutOp(table string, item Item, conds ...Condition) Op {
	return Op{table: table, kind: opPut, item: item, conds: conds}
}

// DeleteOp is Delete as part of a Write.
func DeleteOp(table string, key Key, conds ...Condition) Op {
	return Op{table: table, kind: opDelete, item: Item{Key: key}, conds: conds}
}

// AddOp is Add as part of a Write. Write does not return the new value
// (a DynamoDB transaction returns none); use Add or AddMany for that.
func AddOp(table string, key Key, delta int64, expiresAt time.Time) Op {
	return Op{table: table, kind: opAdd, item: Item{Key: key}, delta: delta, expiresAt: expiresAt}
}

func (o Op) String() string {
	name := [...]string{opPut: "put", opDelete: "delete", opAdd: "add"}[o.kind]
	return fmt.Sprintf("%s %s/%s in %s", name, o.item.PK, o.item.SK, o.table)
}

// Counter is one counter of AddMany.
type Counter struct {
	Key       Key
	Delta     int64
	ExpiresAt time.Time
}

const (
	// MaxWriteOps bounds one Write: DynamoDB's TransactWriteItems limit.
	MaxWriteOps = 100
	// MaxWriteBytes bounds the items of one Write together (DynamoDB's
	// transaction limit), counted as MaxItemBytes counts one item.
	MaxWriteBytes = 4 << 20
)

// validateWrite checks a Write's ops the same way on both backends: each
// valid on its own, at most MaxWriteOps of them, each item once (DynamoDB
// refuses two operations on one item in a transaction).
func validateWrite(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: a write needs at least one op", ErrInvalid)
	}
	if len(ops) > MaxWriteOps {
		return fmt.Errorf("%w: %d ops in one write, at most %d", ErrInvalid, len(ops), MaxWriteOps)
	}
	type target struct {
		table string
		key   Key
	}
	seen := make(map[target]bool, len(ops))
	size := 0
	for _, o := range ops {
		if o.table == "" {
			return fmt.Errorf("%w: %s: op needs a table", ErrInvalid, o)
		}
		var err error
		switch o.kind {
		case opPut:
			err = validateItem(o.item)
			size += itemSize(o.item)
		case opDelete, opAdd:
			err = validateKey(o.item.Key)
			size += itemSize(Item{Key: o.item.Key})
		default:
			err = fmt.Errorf("%w: zero Op", ErrInvalid)
		}
		if err != nil {
			return err
		}
		if err := validateConditions(o.conds); err != nil {
			return err
		}
		t := target{o.table, o.item.Key}
		if seen[t] {
			return fmt.Errorf("%w: %s appears twice in one write", ErrInvalid, o)
		}
		seen[t] = true
	}
	if size > MaxWriteBytes {
		return fmt.Errorf("%w: the write's items are %d bytes, the limit is %d", ErrItemTooLarge, size, MaxWriteBytes)
	}
	return nil
}

func validateCounters(table string, cs []Counter) error {
	if len(cs) == 0 || len(cs) > MaxWriteOps {
		return fmt.Errorf("%w: %d counters, 1 to %d", ErrInvalid, len(cs), MaxWriteOps)
	}
	ops := make([]Op, len(cs))
	for i, c := range cs {
		ops[i] = AddOp(table, c.Key, c.Delta, c.ExpiresAt)
	}
	return validateWrite(ops)
}
