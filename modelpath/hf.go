package modelpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// The Hugging Face hub cache, as huggingface_hub writes it:
//
//	ROOT/models--{org}--{name}/refs/{revision}      a commit hash (40 hex)
//	ROOT/models--{org}--{name}/snapshots/{commit}/  the repo's files, usually
//	                                                 symlinks into ../../blobs
//	ROOT/models--{org}--{name}/blobs/{etag}
//
// A ref may itself contain slashes (refs/pr/1 is stored at refs/refs/pr/1).

// hfName is a parsed Hugging Face name: repo[@revision][:selector].
type hfName struct {
	Repo     string // "org/name" or "name"
	Revision string // a ref name or a commit hash; "" means main
	Selector string // picks a .gguf: a file name, or a quant tag such as Q4_K_M
}

// parseHFName splits repo[@revision][:selector]. Repo ids cannot hold '@'
// or ':' and git ref names cannot hold ':', so the split is unambiguous.
func parseHFName(s string) (hfName, error) {
	var n hfName
	rest := s
	if i := strings.IndexByte(rest, ':'); i >= 0 {
		n.Selector, rest = rest[i+1:], rest[:i]
		// The selector is only compared with file names found on disk,
		// never joined into a path, so any printable text will do.
		if n.Selector == "" || len(n.Selector) > 512 || strings.ContainsFunc(n.Selector, unicode.IsControl) {
			return n, fmt.Errorf("selector %q is not a file name or quant tag", n.Selector)
		}
	}
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		n.Revision, rest = rest[i+1:], rest[:i]
		if n.Revision == "" {
			return n, errors.New("empty revision after '@'")
		}
		if !validRelPath(n.Revision) {
			return n, fmt.Errorf("revision %q is not a ref name or commit hash", n.Revision)
		}
	}
	n.Repo = rest
	parts := strings.Split(rest, "/")
	if len(parts) > 2 {
		return n, fmt.Errorf("repo id %q has more than one '/'", rest)
	}
	for _, p := range parts {
		// Hub repo names may not contain "--" or "..", which is what makes
		// the cache's folder naming reversible.
		if !validSegment(p, 96) || strings.Contains(p, "--") || strings.Contains(p, "..") {
			return n, fmt.Errorf("repo id %q is not of the form org/name", rest)
		}
	}
	return n, nil
}

// validRelPath reports whether s is a relative slash-separated path whose
// components are all valid segments.
func validRelPath(s string) bool {
	if len(s) > 512 {
		return false
	}
	for _, p := range strings.Split(s, "/") {
		if !validSegment(p, 255) {
			return false
		}
	}
	return true
}

// folder is the cache folder of the repo.
func (n hfName) folder() string { return "models--" + strings.ReplaceAll(n.Repo, "/", "--") }

func (n hfName) String() string {
	s := n.Repo
	if n.Revision != "" {
		s += "@" + n.Revision
	}
	if n.Selector != "" {
		s += ":" + n.Selector
	}
	return s
}

// repoFromFolder inverts folder: "models--Qwen--Qwen2.5-0.5B" → "Qwen/Qwen2.5-0.5B".
func repoFromFolder(f string) string {
	return strings.ReplaceAll(strings.TrimPrefix(f, "models--"), "--", "/")
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// isCommitHash reports whether s is a full git commit hash as the cache
// stores them: 40 lowercase hex digits.
func isCommitHash(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// lookupHF is the Hugging Face cache's answer for name.
func (s Stores) lookupHF(name string) lookup {
	n, err := parseHFName(name)
	if err != nil {
		return lookup{where: "not a repo id: " + err.Error()}
	}
	if s.HuggingFace == "" {
		return lookup{where: "not searched"}
	}
	l := lookup{where: "no folder " + n.folder()}
	if isDir(filepath.Join(s.HuggingFace, n.folder())) {
		l.match, l.what = exactMatch, n.String()
		l.path, l.err = resolveHFRepo(filepath.Join(s.HuggingFace, n.folder()), n)
		return l
	}
	var folded []string
	for _, f := range foldedChildren(s.HuggingFace, n.folder()) {
		if isDir(filepath.Join(s.HuggingFace, f)) {
			folded = append(folded, f)
		}
	}
	switch len(folded) {
	case 0:
		return l
	case 1:
		m := n
		m.Repo = repoFromFolder(folded[0])
		l.match, l.what = foldedMatch, m.String()
		l.path, l.err = resolveHFRepo(filepath.Join(s.HuggingFace, folded[0]), m)
	default:
		repos := make([]string, len(folded))
		for i, f := range folded {
			repos[i] = repoFromFolder(f)
		}
		l.match, l.what = foldedMatch, strings.Join(repos, ", ")
		l.err = fmt.Errorf("huggingface %s: %w: the cache holds %s, which differ only in case; spell one exactly",
			n, ErrAmbiguous, strings.Join(repos, " and "))
	}
	return l
}

// resolveHFRepo resolves n inside its repo folder dir.
func resolveHFRepo(dir string, n hfName) (string, error) {
	commit, err := hfCommit(dir, n.Revision)
	if err != nil {
		return "", fmt.Errorf("huggingface %s: %w", n, err)
	}
	snap := filepath.Join(dir, "snapshots", commit)
	if !isDir(snap) {
		return "", fmt.Errorf("huggingface %s: %w: revision resolves to commit %s but %s is missing", n, ErrIncomplete, commit, snap)
	}
	sn, err := readSnapshot(snap)
	if err != nil {
		return "", fmt.Errorf("huggingface %s: %w", n, err)
	}
	p, err := sn.pick(n.Selector)
	if err != nil {
		return "", fmt.Errorf("huggingface %s: %w", n, err)
	}
	return p, nil
}

// hfCommit turns a revision (a ref name, a commit hash, or "" for main) into
// the commit whose snapshot holds the files.
func hfCommit(dir, rev string) (string, error) {
	if rev == "" {
		rev = "main"
	}
	if isCommitHash(rev) && isDir(filepath.Join(dir, "snapshots", rev)) {
		return rev, nil
	}
	refFile := filepath.Join(dir, "refs", filepath.FromSlash(rev))
	b, err := readSmall(refFile, 1024)
	if err == nil {
		commit := strings.TrimSpace(string(b))
		if !isCommitHash(commit) {
			return "", fmt.Errorf("%s holds %q, not a commit hash", refFile, truncate(commit, 60))
		}
		return commit, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	refs, snaps := hfRefs(dir), hfSnapshots(dir)
	var avail []string
	for _, r := range refs {
		avail = append(avail, r.name)
	}
	avail = append(avail, snaps...)
	what := "no ref " + rev
	if isCommitHash(rev) {
		what = "no snapshot of commit " + rev
	}
	if len(avail) == 0 {
		return "", fmt.Errorf("%w: %s, and %s holds no refs or snapshots", ErrIncomplete, what, dir)
	}
	return "", fmt.Errorf("%s in %s; revisions there: %s", what, dir, strings.Join(avail, ", "))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// hfRef is one file under refs/: its name and the commit it holds ("" when
// unreadable or not a hash).
type hfRef struct{ name, commit string }

// hfRefs lists the refs of a repo folder, sorted by name.
func hfRefs(dir string) []hfRef {
	var refs []hfRef
	root := filepath.Join(dir, "refs")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || len(refs) >= 1000 {
			return nil
		}
		rel, relErr := filepath.Rel(root, p)
		if relErr != nil {
			return nil
		}
		r := hfRef{name: filepath.ToSlash(rel)}
		if b, err := readSmall(p, 1024); err == nil && isCommitHash(strings.TrimSpace(string(b))) {
			r.commit = strings.TrimSpace(string(b))
		}
		refs = append(refs, r)
		return nil
	})
	sort.Slice(refs, func(i, j int) bool { return refs[i].name < refs[j].name })
	return refs
}

// hfSnapshots lists the snapshot folders of a repo folder, sorted.
func hfSnapshots(dir string) []string {
	ents, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// scanHF adds the Hugging Face cache's models to l.
func (s Stores) scanHF(l *Listing) error {
	if s.HuggingFace == "" {
		return nil
	}
	ents, err := os.ReadDir(s.HuggingFace)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("huggingface cache %s: %w", s.HuggingFace, err)
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "models--") {
			continue
		}
		dir := filepath.Join(s.HuggingFace, e.Name())
		repo := repoFromFolder(e.Name())
		if _, err := parseHFName(repo); err != nil {
			l.skip(SourceHuggingFace, repo, dir, "folder name is not a repo id: "+err.Error())
			continue
		}
		scanHFRepo(l, dir, repo)
	}
	return nil
}

// scanHFRepo lists every snapshot of one repo folder. The snapshot refs/main
// points at is named by the bare repo id; another is named repo@ref after
// the first ref pointing at it, or repo@commit when no ref does (an older
// revision, or a download of a fixed commit).
func scanHFRepo(l *Listing, dir, repo string) {
	refs := hfRefs(dir)
	byCommit := map[string][]string{}
	for _, r := range refs {
		if r.commit == "" {
			l.skip(SourceHuggingFace, repo+"@"+r.name, filepath.Join(dir, "refs", r.name), "ref holds no commit hash")
			continue
		}
		byCommit[r.commit] = append(byCommit[r.commit], r.name)
	}
	snaps := hfSnapshots(dir)
	have := map[string]bool{}
	for _, c := range snaps {
		have[c] = true
	}
	for _, r := range refs {
		if r.commit != "" && !have[r.commit] {
			l.skip(SourceHuggingFace, repo+"@"+r.name, filepath.Join(dir, "snapshots", r.commit), "the ref's snapshot is missing")
		}
	}
	if len(snaps) == 0 && len(refs) == 0 {
		l.skip(SourceHuggingFace, repo, dir, "no refs and no snapshots")
	}
	for _, c := range snaps {
		snap := filepath.Join(dir, "snapshots", c)
		name := repo
		switch names := byCommit[c]; {
		case !isCommitHash(c):
			l.skip(SourceHuggingFace, repo, snap, "snapshot folder is not named by a commit hash")
			continue
		case slices.Contains(names, "main"):
			// The bare repo id already means main.
		case len(names) > 0:
			name += "@" + names[0]
		default:
			name += "@" + c
		}
		sn, err := readSnapshot(snap)
		if err != nil {
			l.skip(SourceHuggingFace, name, snap, err.Error())
			continue
		}
		sn.list(l, name)
	}
}
