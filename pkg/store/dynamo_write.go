package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// AddMany implements Store: the updates go out at once, so the counters
// cost one round trip, not one each.
func (d *Dynamo) AddMany(ctx context.Context, table string, counters []Counter) ([]int64, error) {
	if err := validateCounters(table, counters); err != nil {
		return nil, err
	}
	values := make([]int64, len(counters))
	errs := make([]error, len(counters))
	var wg sync.WaitGroup
	for i, c := range counters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			values[i], errs[i] = d.Add(ctx, table, c.Key, c.Delta, c.ExpiresAt)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return values, nil
}

// Write implements Store with one TransactWriteItems. A put whose
// conditions do not fix the current version reads it first and pins it,
// as Put does; an add updates a live counter, or, when the transaction
// says there is none, creates a fresh one; either guess that turns out
// wrong (a concurrent writer) sends the transaction again. A server that
// does not know TransactWriteItems (dynalite) gets the ops one at a time
// (writeInOrder), from then on.
func (d *Dynamo) Write(ctx context.Context, ops ...Op) ([]Item, error) {
	if err := validateWrite(ops); err != nil {
		return nil, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	if d.noTransactions.Load() {
		return d.writeInOrder(ctx, ops)
	}
	w := txWrite{ops: ops, fresh: make([]bool, len(ops)), pinned: make([]bool, len(ops)), current: make([]int64, len(ops))}
	for i, o := range ops {
		if o.kind == opPut {
			w.current[i], w.pinned[i] = pinnedVersion(o.conds)
		}
	}
	for attempt := range maxPutAttempts {
		if attempt > 0 && w.conflict {
			// Another transaction held one of the items: back off a little.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("store: TransactWriteItems at %s: %w", d.endpoint, ctx.Err())
			case <-time.After(time.Duration(attempt) * 10 * time.Millisecond):
			}
		}
		out, err := d.transact(ctx, &w)
		if err == nil || !errors.Is(err, errRetryTransaction) {
			if isUnknownOperation(err) {
				d.noTransactions.Store(true)
				return d.writeInOrder(ctx, ops)
			}
			return out, err
		}
	}
	return nil, fmt.Errorf("store: write of %d items at %s: lost %d races with concurrent writers", len(ops), d.endpoint, maxPutAttempts)
}

// txWrite is the state of one Write across its attempts.
type txWrite struct {
	ops []Op
	// fresh marks adds to send as the creation of a fresh counter.
	fresh []bool
	// pinned marks puts whose own conditions fix the current version.
	pinned  []bool
	current []int64
	// conflict says the last attempt met a concurrent transaction.
	conflict bool
}

var errRetryTransaction = errors.New("retry the transaction")

func (d *Dynamo) transact(ctx context.Context, w *txWrite) ([]Item, error) {
	now := d.now()
	items := make([]types.TransactWriteItem, len(w.ops))
	out := make([]Item, len(w.ops))
	for i, o := range w.ops {
		e := newExpr(now)
		for _, c := range o.conds {
			e.add(c)
		}
		switch o.kind {
		case opPut:
			if !w.pinned[i] {
				cur, err := d.read(ctx, o.table, o.item.Key)
				if err != nil {
					return nil, err
				}
				if err := checkConditions(o.conds, cur, o.item.Key); err != nil {
					return nil, fmt.Errorf("%w (%s)", err, o)
				}
				w.current[i] = 0
				if cur != nil {
					w.current[i] = cur.Version
				}
				if w.current[i] == 0 {
					e.add(IfNotExists())
				} else {
					e.add(IfVersion(w.current[i]))
				}
			}
			it := o.item
			it.Version = w.current[i] + 1
			out[i] = it
			cond := e.condition()
			names, values := e.used(aws.ToString(cond))
			items[i].Put = &types.Put{TableName: aws.String(d.table(o.table)), Item: marshalItem(it),
				ConditionExpression: cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values}
		case opDelete:
			cond := e.condition()
			names, values := e.used(aws.ToString(cond))
			items[i].Delete = &types.Delete{TableName: aws.String(d.table(o.table)), Key: keyAttrs(o.item.Key),
				ConditionExpression: cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values}
		case opAdd:
			if w.fresh[i] {
				fresh := Item{Key: o.item.Key, Counter: o.delta, Version: 1, ExpiresAt: o.expiresAt}
				names, values := e.used(absentExpr)
				items[i].Put = &types.Put{TableName: aws.String(d.table(o.table)), Item: marshalItem(fresh),
					ConditionExpression: aws.String(absentExpr), ExpressionAttributeNames: names, ExpressionAttributeValues: values}
				break
			}
			e.names["#n"], e.names["#ver"] = attrCounter, attrVersion
			e.values[":d"], e.values[":one"] = numAttr(o.delta), numAttr(1)
			const update = "SET #n = #n + :d, #ver = #ver + :one"
			names, values := e.used(update, liveExpr)
			items[i].Update = &types.Update{TableName: aws.String(d.table(o.table)), Key: keyAttrs(o.item.Key),
				UpdateExpression: aws.String(update), ConditionExpression: aws.String(liveExpr),
				ExpressionAttributeNames: names, ExpressionAttributeValues: values}
		}
	}
	_, err := d.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	if err == nil {
		return out, nil
	}
	var canceled *types.TransactionCanceledException
	if !errors.As(err, &canceled) {
		var rnf *types.ResourceNotFoundException
		if errors.As(err, &rnf) {
			var tables []string
			for _, o := range w.ops {
				if t := d.table(o.table); !slices.Contains(tables, t) {
					tables = append(tables, t)
				}
			}
			return nil, fmt.Errorf("%w: one of %s at %s: %s", ErrTableNotFound, strings.Join(tables, ", "), d.endpoint, rnf.ErrorMessage())
		}
		return nil, fmt.Errorf("store: dynamodb TransactWriteItems at %s: %w", d.endpoint, err)
	}
	w.conflict = false
	retry := false
	for i, r := range canceled.CancellationReasons {
		if i >= len(w.ops) {
			break
		}
		o := w.ops[i]
		switch aws.ToString(r.Code) {
		case "", "None":
		case "ConditionalCheckFailed":
			switch {
			case o.kind == opAdd:
				// The counter was not as guessed (absent, or created
				// meanwhile): try the other form.
				w.fresh[i] = !w.fresh[i]
				retry = true
			case o.kind == opPut && !w.pinned[i]:
				retry = true // moved since the read: read again
			default:
				return nil, fmt.Errorf("%w: %s", ErrConditionFailed, o)
			}
		case "TransactionConflict":
			w.conflict, retry = true, true
		default:
			return nil, fmt.Errorf("store: dynamodb TransactWriteItems at %s: %s: %s: %s", d.endpoint, o, aws.ToString(r.Code), aws.ToString(r.Message))
		}
	}
	if retry {
		return nil, errRetryTransaction
	}
	return nil, fmt.Errorf("store: dynamodb TransactWriteItems at %s: %w", d.endpoint, err)
}

// writeInOrder is Write on a server without transactions: each op on its
// own, in order, stopping at the first that fails. Not atomic: the ops
// before a failure stay written.
func (d *Dynamo) writeInOrder(ctx context.Context, ops []Op) ([]Item, error) {
	out := make([]Item, len(ops))
	for i, o := range ops {
		var err error
		switch o.kind {
		case opPut:
			out[i], err = d.Put(ctx, o.table, o.item, o.conds...)
		case opDelete:
			err = d.Delete(ctx, o.table, o.item.Key, o.conds...)
		case opAdd:
			_, err = d.Add(ctx, o.table, o.item.Key, o.delta, o.expiresAt)
		}
		if err != nil {
			return nil, fmt.Errorf("%w (%s; the %d ops before it are written: this server has no transactions)", err, o, i)
		}
	}
	return out, nil
}

func isUnknownOperation(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "UnknownOperationException"
}
