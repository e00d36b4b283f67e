package redact

import "testing"

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:7070", "http://127.0.0.1:7070"},
		{"http://bob@127.0.0.1:7070", "http://bob@127.0.0.1:7070"},
		{"http://bob:hunter2@127.0.0.1:7070/x?y#z", "http://bob:xxxxx@127.0.0.1:7070/x?y#z"},
		{"http://bob:hunter2@127.0.0.1:99999", "http://bob:xxxxx@127.0.0.1:99999"},
		{"redis://:hunter2@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"bob:hunter2@127.0.0.1:2379", "bob:xxxxx@127.0.0.1:2379"},
		{"http://bob:p@ss:w@rd@h:1", "http://bob:xxxxx@h:1"},
		{"http://h:1/a@b", "http://h:1/a@b"},
		{"127.0.0.1:2379", "127.0.0.1:2379"},
		{"", ""},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
