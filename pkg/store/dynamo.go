package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// DynamoDB attribute names of an item. Service attributes are stored as
// top-level "a_<name>" strings so conditions can test them.
const (
	attrPK      = "pk"
	attrSK      = "sk"
	attrVersion = "ver"
	attrCounter = "n"
	attrData    = "d"
	// attrExpMillis is the precise expiry every read and condition uses.
	attrExpMillis = "exp_ms"
	// attrTTL is the same expiry in epoch seconds, for DynamoDB's own TTL
	// sweeper, which only reclaims space (and may lag by days).
	attrTTL = "ttl"
)

// DynamoAPI is the part of the DynamoDB client the backend uses.
type DynamoAPI interface {
	CreateTable(context.Context, *dynamodb.CreateTableInput, ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(context.Context, *dynamodb.UpdateTimeToLiveInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

var _ DynamoAPI = (*dynamodb.Client)(nil)

// Dynamo is the DynamoDB backend.
type Dynamo struct {
	api      DynamoAPI
	prefix   string
	endpoint string
	now      func() time.Time
	// noTransactions is set once the server answered that it has no
	// TransactWriteItems (dynalite): Write then applies ops in order.
	noTransactions atomic.Bool
}

var _ Store = (*Dynamo)(nil)

// DynamoOptions configure the DynamoDB backend.
type DynamoOptions struct {
	// TablePrefix is prepended to every table name, e.g. "conclave-prod-".
	TablePrefix string
	// Endpoint names the server in errors (the client carries the real
	// setting); empty means AWS.
	Endpoint string
	// Now is the clock expiry is judged by; time.Now when nil.
	Now func() time.Time
}

// NewDynamo returns a DynamoDB-backed Store using client, whose retryer gives
// transient errors the SDK's backoff.
func NewDynamo(client DynamoAPI, opts DynamoOptions) *Dynamo {
	d := &Dynamo{api: client, prefix: opts.TablePrefix, endpoint: opts.Endpoint, now: opts.Now}
	if d.endpoint == "" {
		d.endpoint = "AWS"
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d
}

// Close implements Store; the SDK client holds nothing to release.
func (d *Dynamo) Close() error { return nil }

func (d *Dynamo) table(name string) string { return d.prefix + name }

// wrap gives an SDK error the table and endpoint, and maps the errors callers
// test for.
func (d *Dynamo) wrap(op, table string, err error) error {
	var ccf *types.ConditionalCheckFailedException
	var rnf *types.ResourceNotFoundException
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ccf):
		return fmt.Errorf("%w: %s on table %s", ErrConditionFailed, op, d.table(table))
	case errors.As(err, &rnf):
		return fmt.Errorf("%w: %s at %s: %s", ErrTableNotFound, d.table(table), d.endpoint, rnf.ErrorMessage())
	}
	return fmt.Errorf("store: dynamodb %s on table %s at %s: %w", op, d.table(table), d.endpoint, err)
}

// EnsureTable implements Store. Every table has the same key schema (pk, sk
// strings) and on-demand billing.
func (d *Dynamo) EnsureTable(ctx context.Context, t Table) error {
	if t.Name == "" {
		return fmt.Errorf("%w: table needs a name", ErrInvalid)
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	name := d.table(t.Name)
	_, err := d.api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrPK), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(attrSK), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(attrSK), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return d.wrap("CreateTable", t.Name, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(d.api, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 100*time.Millisecond, 2*time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)}, 2*time.Minute); err != nil {
		return d.wrap("DescribeTable", t.Name, err)
	}
	_, err = d.api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attrTTL), Enabled: aws.Bool(true),
		},
	})
	if err != nil && !ttlAlreadyOnOrUnsupported(err) {
		return d.wrap("UpdateTimeToLive", t.Name, err)
	}
	return nil
}

// ttlAlreadyOnOrUnsupported accepts the two answers that leave expiry
// correct: TTL already enabled (AWS answers ValidationException), or a local
// server without TTL (dynalite answers UnknownOperationException). Reads and
// conditions never depend on the sweeper.
func ttlAlreadyOnOrUnsupported(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "UnknownOperationException":
		return true
	case "ValidationException":
		return strings.Contains(ae.ErrorMessage(), "already enabled")
	}
	return false
}

func keyAttrs(k Key) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		attrPK: &types.AttributeValueMemberS{Value: k.PK},
		attrSK: &types.AttributeValueMemberS{Value: k.SK},
	}
}

func numAttr(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func marshalItem(it Item) map[string]types.AttributeValue {
	m := keyAttrs(it.Key)
	m[attrVersion] = numAttr(it.Version)
	m[attrCounter] = numAttr(it.Counter)
	if len(it.Data) > 0 {
		m[attrData] = &types.AttributeValueMemberB{Value: it.Data}
	}
	if !it.ExpiresAt.IsZero() {
		m[attrExpMillis] = numAttr(it.ExpiresAt.UnixMilli())
		m[attrTTL] = numAttr((it.ExpiresAt.UnixMilli() + 999) / 1000)
	}
	for k, v := range it.Attrs {
		m[attrPrefix+k] = &types.AttributeValueMemberS{Value: v}
	}
	return m
}

func unmarshalItem(m map[string]types.AttributeValue) (Item, error) {
	var it Item
	for name, av := range m {
		switch v := av.(type) {
		case *types.AttributeValueMemberS:
			switch {
			case name == attrPK:
				it.PK = v.Value
			case name == attrSK:
				it.SK = v.Value
			case strings.HasPrefix(name, attrPrefix):
				if it.Attrs == nil {
					it.Attrs = map[string]string{}
				}
				it.Attrs[name[len(attrPrefix):]] = v.Value
			}
		case *types.AttributeValueMemberN:
			n, err := strconv.ParseInt(v.Value, 10, 64)
			if err != nil {
				return it, fmt.Errorf("store: attribute %s: %w", name, err)
			}
			switch name {
			case attrVersion:
				it.Version = n
			case attrCounter:
				it.Counter = n
			case attrExpMillis:
				it.ExpiresAt = time.UnixMilli(n)
			}
		case *types.AttributeValueMemberB:
			if name == attrData {
				it.Data = v.Value
			}
		}
	}
	return it, nil
}

// expr accumulates a condition expression's names and values.
type expr struct {
	names  map[string]string
	values map[string]types.AttributeValue
	parts  []string
}

func newExpr(now time.Time) *expr {
	return &expr{
		names: map[string]string{"#pk": attrPK, "#exp": attrExpMillis},
		values: map[string]types.AttributeValue{
			":now": numAttr(now.UnixMilli()),
		},
	}
}

const (
	liveExpr   = "(attribute_exists(#pk) AND (attribute_not_exists(#exp) OR #exp > :now))"
	absentExpr = "(attribute_not_exists(#pk) OR #exp <= :now)"
)

// add translates a Condition with the same meaning Condition.holds gives it
// on the embedded backend.
func (e *expr) add(c Condition) {
	i := len(e.parts)
	switch c.kind {
	case condNotExists:
		e.parts = append(e.parts, absentExpr)
	case condExists:
		e.parts = append(e.parts, liveExpr)
	case condVersion:
		e.names["#ver"] = attrVersion
		v := fmt.Sprintf(":v%d", i)
		e.values[v] = numAttr(c.ver)
		e.parts = append(e.parts, "(#ver = "+v+" AND "+liveExpr+")")
	case condAttrEquals:
		n, v := fmt.Sprintf("#a%d", i), fmt.Sprintf(":a%d", i)
		e.names[n] = attrPrefix + c.name
		e.values[v] = &types.AttributeValueMemberS{Value: c.value}
		e.parts = append(e.parts, "("+n+" = "+v+" AND "+liveExpr+")")
	}
}

func (e *expr) condition() *string {
	if len(e.parts) == 0 {
		return nil
	}
	return aws.String(strings.Join(e.parts, " AND "))
}

// used drops names and values the expression does not mention; DynamoDB
// rejects unused ones.
func (e *expr) used(exprs ...string) (map[string]string, map[string]types.AttributeValue) {
	all := strings.Join(exprs, " ")
	names := map[string]string{}
	for k, v := range e.names {
		if strings.Contains(all, k) {
			names[k] = v
		}
	}
	values := map[string]types.AttributeValue{}
	for k, v := range e.values {
		if containsToken(all, k) {
			values[k] = v
		}
	}
	if len(names) == 0 {
		names = nil
	}
	if len(values) == 0 {
		values = nil
	}
	return names, values
}

// containsToken finds a placeholder not followed by more name characters, so
// ":v1" does not match inside ":v10".
func containsToken(s, tok string) bool {
	for i := strings.Index(s, tok); i >= 0; {
		end := i + len(tok)
		if end == len(s) || !isNameChar(s[end]) {
			return true
		}
		j := strings.Index(s[end:], tok)
		if j < 0 {
			return false
		}
		i = end + j
	}
	return false
}

func isNameChar(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func (d *Dynamo) read(ctx context.Context, table string, key Key) (*Item, error) {
	out, err := d.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(d.table(table)), Key: keyAttrs(key), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, d.wrap("GetItem", table, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	it, err := unmarshalItem(out.Item)
	if err != nil {
		return nil, err
	}
	if !live(it.ExpiresAt, d.now()) {
		return nil, nil
	}
	return &it, nil
}

// Get implements Store.
func (d *Dynamo) Get(ctx context.Context, table string, key Key) (Item, error) {
	if err := validateKey(key); err != nil {
		return Item{}, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	cur, err := d.read(ctx, table, key)
	if err != nil {
		return Item{}, err
	}
	if cur == nil {
		return Item{}, fmt.Errorf("%w: %s/%s in %s", ErrNotFound, key.PK, key.SK, table)
	}
	return *cur, nil
}

// maxPutAttempts bounds the optimistic retry of a Put that loses a race; a
// loser re-reads and re-checks its conditions each time.
const maxPutAttempts = 16

// Put implements Store. The new version is computed from the current one and
// pinned in the write's condition, so concurrent writers serialize: when the
// caller's own conditions fix the current version (IfVersion, IfNotExists),
// that takes one request; otherwise the item is read first.
func (d *Dynamo) Put(ctx context.Context, table string, item Item, conds ...Condition) (Item, error) {
	if err := validateItem(item); err != nil {
		return Item{}, err
	}
	if err := validateConditions(conds); err != nil {
		return Item{}, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()

	pinned, known := pinnedVersion(conds)
	for range maxPutAttempts {
		now := d.now()
		e := newExpr(now)
		for _, c := range conds {
			e.add(c)
		}
		current := pinned
		if !known {
			cur, err := d.read(ctx, table, item.Key)
			if err != nil {
				return Item{}, err
			}
			if err := checkConditions(conds, cur, item.Key); err != nil {
				return Item{}, err
			}
			current = 0
			if cur != nil {
				current = cur.Version
			}
			if current == 0 {
				e.add(IfNotExists())
			} else {
				e.add(IfVersion(current))
			}
		}
		item.Version = current + 1
		cond := e.condition()
		names, values := e.used(aws.ToString(cond))
		_, err := d.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(d.table(table)), Item: marshalItem(item),
			ConditionExpression: cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		})
		err = d.wrap("PutItem", table, err)
		if known || !errors.Is(err, ErrConditionFailed) {
			if err != nil {
				return Item{}, err
			}
			return item, nil
		}
		// Another writer moved the version between the read and the
		// write; re-read and re-check.
	}
	return Item{}, fmt.Errorf("store: put %s/%s in %s: lost %d races with concurrent writers", item.PK, item.SK, table, maxPutAttempts)
}

// pinnedVersion reports the current version the conditions require, when
// they require one: IfVersion(v) means v, IfNotExists means none (0).
func pinnedVersion(conds []Condition) (int64, bool) {
	for _, c := range conds {
		switch c.kind {
		case condVersion:
			return c.ver, true
		case condNotExists:
			return 0, true
		}
	}
	return 0, false
}

// Delete implements Store.
func (d *Dynamo) Delete(ctx context.Context, table string, key Key, conds ...Condition) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := validateConditions(conds); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	e := newExpr(d.now())
	for _, c := range conds {
		e.add(c)
	}
	cond := e.condition()
	names, values := e.used(aws.ToString(cond))
	_, err := d.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(d.table(table)), Key: keyAttrs(key),
		ConditionExpression: cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values,
	})
	return d.wrap("DeleteItem", table, err)
}

// Add implements Store: an update of a live item, or else the creation of a
// fresh counter item replacing an absent or expired one; a lost race between
// two creators sends the loser back to the update.
func (d *Dynamo) Add(ctx context.Context, table string, key Key, delta int64, expiresAt time.Time) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	for range maxPutAttempts {
		e := newExpr(d.now())
		e.names["#n"], e.names["#ver"] = attrCounter, attrVersion
		e.values[":d"], e.values[":one"] = numAttr(delta), numAttr(1)
		update := "SET #n = #n + :d, #ver = #ver + :one"
		names, values := e.used(update, liveExpr)
		out, err := d.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(d.table(table)), Key: keyAttrs(key),
			UpdateExpression: aws.String(update), ConditionExpression: aws.String(liveExpr),
			ExpressionAttributeNames: names, ExpressionAttributeValues: values,
			ReturnValues: types.ReturnValueUpdatedNew,
		})
		err = d.wrap("UpdateItem", table, err)
		if err == nil {
			n, ok := out.Attributes[attrCounter].(*types.AttributeValueMemberN)
			if !ok {
				return 0, fmt.Errorf("store: UpdateItem on %s returned no counter", d.table(table))
			}
			return strconv.ParseInt(n.Value, 10, 64)
		}
		if !errors.Is(err, ErrConditionFailed) {
			return 0, err
		}
		fresh := Item{Key: key, Counter: delta, Version: 1, ExpiresAt: expiresAt}
		ce := newExpr(d.now())
		names, values = ce.used(absentExpr)
		_, err = d.api.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(d.table(table)), Item: marshalItem(fresh),
			ConditionExpression: aws.String(absentExpr), ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		})
		err = d.wrap("PutItem", table, err)
		if err == nil {
			return delta, nil
		}
		if !errors.Is(err, ErrConditionFailed) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("store: add to %s/%s in %s: lost %d races with concurrent writers", key.PK, key.SK, table, maxPutAttempts)
}

// Query implements Store.
func (d *Dynamo) Query(ctx context.Context, table string, q Query) (Page, error) {
	q, after, err := prepareQuery(q)
	if err != nil {
		return Page{}, err
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()

	e := newExpr(d.now())
	e.names["#sk"] = attrSK
	e.values[":pk"] = &types.AttributeValueMemberS{Value: q.PK}
	keyCond := "#pk = :pk"
	switch {
	case q.Prefix != "":
		e.values[":p"] = &types.AttributeValueMemberS{Value: q.Prefix}
		keyCond += " AND begins_with(#sk, :p)"
	case q.From != "" && q.To != "":
		e.values[":from"], e.values[":to"] = &types.AttributeValueMemberS{Value: q.From}, &types.AttributeValueMemberS{Value: q.To}
		keyCond += " AND #sk BETWEEN :from AND :to"
	case q.From != "":
		e.values[":from"] = &types.AttributeValueMemberS{Value: q.From}
		keyCond += " AND #sk >= :from"
	case q.To != "":
		e.values[":to"] = &types.AttributeValueMemberS{Value: q.To}
		keyCond += " AND #sk <= :to"
	}
	const filter = "attribute_not_exists(#exp) OR #exp > :now"
	names, values := e.used(keyCond, filter)
	in := &dynamodb.QueryInput{
		TableName: aws.String(d.table(table)), ConsistentRead: aws.Bool(true),
		KeyConditionExpression: aws.String(keyCond), FilterExpression: aws.String(filter),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		ScanIndexForward: aws.Bool(!q.Reverse),
	}
	if after != "" {
		in.ExclusiveStartKey = keyAttrs(Key{PK: q.PK, SK: after})
	}
	var page Page
	for {
		// One more than needed tells whether another page exists.
		in.Limit = aws.Int32(int32(q.Limit - len(page.Items) + 1))
		out, err := d.api.Query(ctx, in)
		if err != nil {
			return Page{}, d.wrap("Query", table, err)
		}
		for _, raw := range out.Items {
			if len(page.Items) == q.Limit {
				page.Cursor = encodeCursor(q.PK, page.Items[len(page.Items)-1].SK)
				return page, nil
			}
			it, err := unmarshalItem(raw)
			if err != nil {
				return Page{}, err
			}
			page.Items = append(page.Items, it)
		}
		if out.LastEvaluatedKey == nil {
			return page, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// batchGetMax is DynamoDB's per-request key limit.
const batchGetMax = 100

// BatchGet implements Store.
func (d *Dynamo) BatchGet(ctx context.Context, table string, keys []Key) ([]Item, error) {
	if err := validateBatch(keys); err != nil {
		return nil, err
	}
	seen := make(map[Key]bool, len(keys))
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	found := make(map[Key]Item, len(keys))
	name := d.table(table)
	for start := 0; start < len(keys); start += batchGetMax {
		var req []map[string]types.AttributeValue
		for _, k := range keys[start:min(start+batchGetMax, len(keys))] {
			// DynamoDB rejects duplicate keys in one request.
			if !seen[k] {
				seen[k] = true
				req = append(req, keyAttrs(k))
			}
		}
		pending := map[string]types.KeysAndAttributes{name: {Keys: req, ConsistentRead: aws.Bool(true)}}
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt > 0 {
				// Unprocessed keys mean throttling: back off before asking again.
				select {
				case <-ctx.Done():
					return nil, fmt.Errorf("store: BatchGetItem on %s at %s: %w", name, d.endpoint, ctx.Err())
				case <-time.After(min(time.Duration(1<<min(attempt, 6))*50*time.Millisecond, 2*time.Second)):
				}
			}
			out, err := d.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: pending})
			if err != nil {
				return nil, d.wrap("BatchGetItem", table, err)
			}
			now := d.now()
			for _, raw := range out.Responses[name] {
				it, err := unmarshalItem(raw)
				if err != nil {
					return nil, err
				}
				if live(it.ExpiresAt, now) {
					found[it.Key] = it
				}
			}
			pending = out.UnprocessedKeys
		}
	}
	out := make([]Item, 0, len(found))
	for _, k := range keys {
		if it, ok := found[k]; ok {
			out = append(out, it)
			delete(found, k)
		}
	}
	return out, nil
}
