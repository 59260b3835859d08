package status

import (
	"testing"

	"tidemark"
)

func TestApplyTableStates(t *testing.T) {
	rep := &Report{Tables: []Table{{Table: "shop.orders", Mode: ModeStreaming}, {Table: "shop.items", Mode: ModeStreaming}}}
	ApplyTableStates(rep, []tidemark.TableState{
		{Table: tidemark.TableID{Database: "shop", Name: "orders"}, Mode: tidemark.TableQuarantined, Reason: "narrowed column amount"},
		{Table: tidemark.TableID{Database: "shop", Name: "nokey"}, Mode: tidemark.TableQuarantined, Reason: "no primary key"},
	}, "")
	if rep.Tables[0].Mode != string(tidemark.TableQuarantined) || rep.Tables[0].Reason == "" || rep.Tables[1].Mode != ModeStreaming {
		t.Fatalf("modes %+v", rep.Tables)
	}
	if len(rep.Tables) != 3 || rep.Tables[2].Table != "shop.nokey" {
		t.Fatalf("a quarantined table without a target is not listed: %+v", rep.Tables)
	}
}
