// Test double of Apple's Foundation framework (macOS 13 SDK): the subset csrc/metal/*.mm and the
// doubles of Metal and tensorflow-metal use, with Apple's names and signatures and nothing Apple's headers lack.
// Implemented by dev/apple_doubles/src/foundation.mm over libobjc2; conventions: dev/apple_doubles/README.md.
#pragma once
#import <objc/NSObject.h>
#import <dispatch/dispatch.h>

#include <stdint.h>

// ---- NSObjCRuntime.h --------------------------------------------------------------------------------------
#define FOUNDATION_EXPORT extern "C" __attribute__((visibility("default")))
#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))
#define NS_REQUIRES_NIL_TERMINATION __attribute__((sentinel(0, 1)))
#define NSIntegerMax LONG_MAX
#define NSUIntegerMax ULONG_MAX
typedef double NSTimeInterval;
#ifndef __nullable  // <sys/cdefs.h> on macOS
#define __nullable _Nullable
#endif

NS_ASSUME_NONNULL_BEGIN

@class NSArray<ObjectType>, NSDictionary<KeyType, ObjectType>, NSError, NSString, NSURL;

// ---- NSObject.h -------------------------------------------------------------------------------------------
@protocol NSCopying
- (id)copyWithZone:(nullable NSZone*)zone;
@end

// ---- NSEnumerator.h ---------------------------------------------------------------------------------------
typedef struct {
  unsigned long state;
  id __unsafe_unretained _Nullable* _Nullable itemsPtr;
  unsigned long* _Nullable mutationsPtr;
  unsigned long extra[5];
} NSFastEnumerationState;

@protocol NSFastEnumeration
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState*)state
                                  objects:(id __unsafe_unretained _Nullable[_Nonnull])buffer
                                    count:(NSUInteger)len;
@end

// ---- NSString.h -------------------------------------------------------------------------------------------
@interface NSString : NSObject <NSCopying>
@property (readonly) NSUInteger length;
@property (nullable, readonly) const char* UTF8String NS_RETURNS_INNER_POINTER;
+ (nullable instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;
- (nullable instancetype)initWithUTF8String:(const char*)nullTerminatedCString;
- (BOOL)isEqualToString:(NSString*)aString;
- (BOOL)hasPrefix:(NSString*)str;
@end

// ---- NSArray.h --------------------------------------------------------------------------------------------
@interface NSArray<__covariant ObjectType> : NSObject <NSCopying, NSFastEnumeration>
@property (readonly) NSUInteger count;
- (ObjectType)objectAtIndex:(NSUInteger)index;
- (ObjectType)objectAtIndexedSubscript:(NSUInteger)idx;
- (BOOL)containsObject:(ObjectType)anObject;
@property (nullable, nonatomic, readonly) ObjectType firstObject;
+ (instancetype)array;
+ (instancetype)arrayWithObjects:(const ObjectType _Nonnull[_Nonnull])objects count:(NSUInteger)cnt;
@end

@interface NSMutableArray<ObjectType> : NSArray<ObjectType>
- (void)addObject:(ObjectType)anObject;
- (void)removeAllObjects;
@end

// ---- NSDictionary.h ---------------------------------------------------------------------------------------
@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject <NSCopying>
@property (readonly) NSUInteger count;
- (nullable ObjectType)objectForKey:(KeyType)aKey;
- (nullable ObjectType)objectForKeyedSubscript:(KeyType)key;
+ (instancetype)dictionaryWithObjects:(const ObjectType _Nonnull[_Nullable])objects
                              forKeys:(const KeyType<NSCopying> _Nonnull[_Nullable])keys
                                count:(NSUInteger)cnt;
@end

// ---- NSError.h --------------------------------------------------------------------------------------------
typedef NSString* NSErrorDomain;
typedef NSString* NSErrorUserInfoKey;
FOUNDATION_EXPORT NSErrorUserInfoKey const NSLocalizedDescriptionKey;

@interface NSError : NSObject <NSCopying>
+ (instancetype)errorWithDomain:(NSErrorDomain)domain
                           code:(NSInteger)code
                       userInfo:(nullable NSDictionary<NSErrorUserInfoKey, id>*)dict;
@property (readonly, copy) NSErrorDomain domain;
@property (readonly) NSInteger code;
@property (readonly, copy) NSDictionary<NSErrorUserInfoKey, id>* userInfo;
@property (readonly, copy) NSString* localizedDescription;
@end

// ---- NSException.h ----------------------------------------------------------------------------------------
typedef NSString* NSExceptionName;
FOUNDATION_EXPORT NSExceptionName const NSInvalidArgumentException;
FOUNDATION_EXPORT NSExceptionName const NSInternalInconsistencyException;

@interface NSException : NSObject <NSCopying>
+ (NSException*)exceptionWithName:(NSExceptionName)name
                           reason:(nullable NSString*)reason
                         userInfo:(nullable NSDictionary*)userInfo;
@property (readonly, copy) NSExceptionName name;
@property (nullable, readonly, copy) NSString* reason;
@property (nullable, readonly, copy) NSDictionary* userInfo;
- (void)raise;
@end

// ---- NSURL.h ----------------------------------------------------------------------------------------------
@interface NSURL : NSObject <NSCopying>
+ (NSURL*)fileURLWithPath:(NSString*)path;
@property (nullable, readonly, copy) NSString* path;
@property (readonly, getter=isFileURL) BOOL fileURL;
- (nullable NSURL*)URLByAppendingPathComponent:(NSString*)pathComponent;
@property (nullable, readonly, copy) NSURL* URLByDeletingLastPathComponent;
@property (nullable, readonly, copy) NSURL* URLByResolvingSymlinksInPath;
@end

// ---- NSFileManager.h --------------------------------------------------------------------------------------
@interface NSFileManager : NSObject
@property (class, readonly, strong) NSFileManager* defaultManager;
- (BOOL)fileExistsAtPath:(NSString*)path;
- (NSString*)stringWithFileSystemRepresentation:(const char*)str length:(NSUInteger)len;
@end

// ---- NSDate.h ---------------------------------------------------------------------------------------------
@interface NSDate : NSObject <NSCopying>
+ (instancetype)date;
@property (readonly) NSTimeInterval timeIntervalSinceNow;
@end

// ---- NSProcessInfo.h --------------------------------------------------------------------------------------
@interface NSProcessInfo : NSObject
@property (class, readonly, strong) NSProcessInfo* processInfo;
@property (readonly, copy) NSString* operatingSystemVersionString;
@end

NS_ASSUME_NONNULL_END
