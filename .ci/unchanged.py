"""Checks that an install changed no package that was already installed.

`python3 unchanged.py BEFORE AFTER`: two `pip list --format=freeze` outputs.
Packages the install added are listed; any package of BEFORE that AFTER
lacks or has at another version fails the check (exit 1).
"""

import sys


def _versions(path):
  with open(path) as f:
    pairs = (line.strip().split('==', 1) for line in f if '==' in line)
    return {name.lower().replace('_', '-'): version for name, version in pairs}


def main(before_path, after_path):
  before, after = _versions(before_path), _versions(after_path)
  changed = [f'{name} {version} -> {after.get(name, "(removed)")}'
             for name, version in sorted(before.items())
             if after.get(name) != version]
  added = sorted(f'{name}=={after[name]}' for name in set(after) - set(before))
  print(f'installed: {", ".join(added) or "nothing new"}')
  if changed:
    print('CHANGED (the install must leave these as they were): ' +
          '; '.join(changed))
    return 1
  kept = [f'{name}=={before[name]}' for name in ('tensorflow', 'keras',
                                                  'tf-keras') if name in before]
  print(f'unchanged: all {len(before)} packages ({", ".join(kept)})')
  return 0


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:]))
