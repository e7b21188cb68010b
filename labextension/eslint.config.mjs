// ESLint (flat config) for the labextension's TypeScript: the recommended JS and typescript-eslint
// rules and JupyterLab's conventions. Formatting is prettier's: eslint-config-prettier turns off
// the rules that would disagree with it; `curly: all` (which it turns off too) is safe with
// prettier and is wanted, so our rules come after it.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules', 'lib', 'coverage', '.yarn', '**/*.d.ts', '**/*.js'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  prettier,
  {
    files: ['**/*.ts', '**/*.tsx', '**/*.mjs'],
    languageOptions: {
      globals: { ...globals.browser, ...globals.es2020 },
      sourceType: 'module'
    },
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }],
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-namespace': 'off',
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  {
    files: ['test/**/*.ts'],
    languageOptions: { globals: { ...globals.jest, ...globals.node } }
  }
);
