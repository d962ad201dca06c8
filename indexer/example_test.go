package indexer_test

import (
	"fmt"
	"log"
	"slices"

	"github.com/iidp/metasync/indexer"
)

// Example builds a store of one source with two indexes, writes two
// objects in one transaction, and looks keys up. An object gives its
// entries per index, in the order of SourceSpec.Indexes.
func Example() {
	store, err := indexer.New(indexer.SourceSpec{Name: "apps", Indexes: []string{"model-to-app", "app-to-team"}})
	if err != nil {
		log.Fatal(err)
	}
	txn := store.Source("apps").Begin()
	txn.Put(indexer.Object{Key: "prod/checkout", Entries: [][]indexer.Entry{
		{{Key: "model1", Value: "checkout"}, {Key: "model2", Value: "checkout"}},
		{{Key: "checkout", Value: "payments"}},
	}})
	txn.Put(indexer.Object{Key: "prod/cart", Entries: [][]indexer.Entry{
		{{Key: "model1", Value: "cart"}},
		{{Key: "cart", Value: "shop"}},
	}})
	txn.Commit() // readers see both objects, or neither

	fmt.Println(store.Lookup("model-to-app", "model1"))
	fmt.Println(store.Lookup("model-to-app", "model3"))

	// An Index handle looks up without finding the index by name; it
	// allocates nothing, and its answer must not be modified.
	ix, _ := store.Index("model-to-app")
	fmt.Println(ix.Lookup("model2"))
	// Output:
	// [cart checkout]
	// []
	// [checkout]
}

// ExampleSnapshot_Resolve follows a chain of indexes in one snapshot:
// the values of each step are the keys of the next.
func ExampleSnapshot_Resolve() {
	store, err := indexer.New(indexer.SourceSpec{Name: "apps", Indexes: []string{"model-to-app", "app-to-team"}})
	if err != nil {
		log.Fatal(err)
	}
	store.Source("apps").Replace([]indexer.Object{
		{Key: "prod/checkout", Entries: [][]indexer.Entry{{{Key: "model1", Value: "checkout"}}, {{Key: "checkout", Value: "payments"}}}},
		{Key: "prod/cart", Entries: [][]indexer.Entry{{{Key: "model1", Value: "cart"}}, {{Key: "cart", Value: "shop"}}}},
	})
	snap := store.Snapshot() // one immutable state: later writes do not change it
	apps, _ := snap.Index("model-to-app")
	teams, _ := snap.Index("app-to-team")
	fmt.Println(snap.Resolve([]indexer.Index{apps, teams}, "model1"))
	// Output: [payments shop]
}

// ExampleSource_Replace replaces a source's whole content, as a relist
// does: an object the new list lacks is deleted.
func ExampleSource_Replace() {
	store, err := indexer.New(indexer.SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}})
	if err != nil {
		log.Fatal(err)
	}
	src := store.Source("apps")
	src.Replace([]indexer.Object{
		{Key: "prod/checkout", Entries: [][]indexer.Entry{{{Key: "model1", Value: "checkout"}}}},
		{Key: "prod/cart", Entries: [][]indexer.Entry{{{Key: "model1", Value: "cart"}}}},
	})
	src.Replace([]indexer.Object{
		{Key: "prod/cart", Entries: [][]indexer.Entry{{{Key: "model1", Value: "cart"}}}},
	})
	fmt.Println(store.Lookup("model-to-app", "model1"))
	// Output: [cart]
}

// ExampleStore_OnCommit hears, in commit order, which index keys each
// commit changed: what a subscription is built on.
func ExampleStore_OnCommit() {
	store, err := indexer.New(indexer.SourceSpec{Name: "apps", Indexes: []string{"model-to-app"}})
	if err != nil {
		log.Fatal(err)
	}
	store.OnCommit(func(prev, next *indexer.Snapshot, changes []indexer.Change) {
		for _, c := range changes {
			keys := slices.Sorted(slices.Values(c.Keys)) // shared with the store: sort a copy
			fmt.Printf("snapshot %d after %d: %v\n", next.Seq(), prev.Seq(), keys)
		}
	})
	txn := store.Source("apps").Begin()
	txn.Put(indexer.Object{Key: "prod/checkout", Entries: [][]indexer.Entry{{{Key: "model1", Value: "checkout"}, {Key: "model2", Value: "checkout"}}}})
	txn.Commit()
	txn = store.Source("apps").Begin()
	txn.Delete("prod/checkout")
	txn.Commit()
	// Output:
	// snapshot 2 after 1: [model1 model2]
	// snapshot 3 after 2: [model1 model2]
}
